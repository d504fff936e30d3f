-- resolves: Transaction
-- source: bank
-- timeout: 2s
-- Fills User.transactions: rows up to the query's now (the engine drops later ones anyway).
select id, user_id, amount, status, merchant, ts
from transactions
where user_id = :user_id and ts <= :now
order by ts

-- resolves: Charge
-- source: support
-- timeout: 2s
-- Fills Account.charges: rows up to the query's now (the engine drops later ones anyway).
select id, account_id, amount, status, refunded, ts
from charges
where account_id = :account_id and ts <= :now
order by ts

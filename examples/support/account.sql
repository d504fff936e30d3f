-- resolves: Account
-- source: support
-- timeout: 2s
select id, name, plan, lang, signup_at from accounts where id = :id

-- resolves: User
-- source: bank
-- timeout: 2s
select id, name, email, signup_at from users where id = :id

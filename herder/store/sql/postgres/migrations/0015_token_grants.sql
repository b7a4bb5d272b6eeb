-- herder schema v15 (PostgreSQL): what a token was given. A submit token runs ad-hoc
-- commands only when created with --allow-adhoc (existing tokens were not: the operator
-- opts in again). A reservation or CI slot remembers the token that made it, so another
-- non-admin token can neither complete nor release it (NULL: made by an admin without a
-- stored token, or before v15).
ALTER TABLE herder_tokens ADD COLUMN allow_adhoc boolean NOT NULL DEFAULT false;
ALTER TABLE herder_reservations ADD COLUMN created_by bigint;
CREATE INDEX herder_reservations_created_by ON herder_reservations (created_by)
    WHERE status = 'active';

-- Placeholder so that this branch's migration 0017 runs without a gap: 0016 belongs to
-- another branch. DROP THIS FILE AT MERGE (the lead replaces it with that branch's file).
SELECT 1;

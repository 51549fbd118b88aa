-- Placeholder so that this branch's migrations (0018..0020) run without a gap: 0017 belongs to
-- another branch. DROP THIS FILE AT MERGE (the lead replaces it with that branch's file).
SELECT 1;

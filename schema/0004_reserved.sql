-- Placeholder: number 0004 is reserved for another branch of issue 13 (migrations must run
-- 1..N without gaps). Drop this file when merging that branch's real 0004.
SELECT 1;

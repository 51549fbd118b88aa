-- placeholder, dropped at merge: migration 0007 is another branch's (issue 12/13).
SELECT 1;

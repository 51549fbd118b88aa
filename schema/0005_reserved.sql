-- placeholder, dropped at merge: migration 0005 is another branch's (issue 12/13).
SELECT 1;

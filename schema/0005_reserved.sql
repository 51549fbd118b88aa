-- placeholder, dropped at merge: 0005 is issue 13's dependencies migration, merged on main.
SELECT 1;

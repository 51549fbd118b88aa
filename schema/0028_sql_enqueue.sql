-- pgq_supervisor schema, version 28 (issue 37, item 3): the SQL producer contract, version 1.
-- Any language, trigger or psql session enqueues in its own transaction with
--
--     SELECT pgq.enqueue('emails.send', '{"to": "a@example.com"}', '{"priority": 5}');
--     SELECT pgq.enqueue_many('[{"type": "t", "payload": {}, "options": {"unique_key": "k"}}]');
--
-- with the validation, notification and uniqueness of the Python call: the same type-name
-- alphabet, the same option names and ranges, a held unique_key returning its holder's id, the
-- insert trigger's notifications, dependencies linked as the Python call links them. A bad
-- argument raises invalid_parameter_value (22023) naming it, before anything is written. The
-- options the Python call resolves with more than one statement of its own (unique_for,
-- unique_states, replace, replace_running, ordered_key) are refused by name in version 1.
-- pgq.sql_contract_version() says which version a database speaks; a later version adds
-- options or functions, never changes these.

CREATE FUNCTION sql_contract_version() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path FROM CURRENT AS $$ SELECT 1 $$;

-- A bad argument: invalid_parameter_value, "<schema>.enqueue: <what> ...".
CREATE FUNCTION enqueue_refuse(p_what text, p_why text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RAISE invalid_parameter_value USING
        MESSAGE = format('%s.enqueue: %s %s', current_schema(), p_what, p_why);
END $$;

-- `p_value` (an option's jsonb) as an integer from p_lo to p_hi, else refused naming `p_what`.
CREATE FUNCTION enqueue_int(p_value jsonb, p_what text, p_lo bigint, p_hi bigint)
RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    n numeric;
BEGIN
    IF jsonb_typeof(p_value) <> 'number' THEN
        PERFORM enqueue_refuse(p_what, format('must be an integer, got %s', left(p_value::text, 60)));
    END IF;
    n := (p_value #>> '{}')::numeric;
    IF n % 1 <> 0 THEN
        PERFORM enqueue_refuse(p_what, format('must be an integer, got %s', left(p_value::text, 60)));
    END IF;
    IF n < p_lo OR n > p_hi THEN
        PERFORM enqueue_refuse(p_what, format('must be from %s to %s, got %s', p_lo, p_hi, n));
    END IF;
    RETURN n::integer;
END $$;

-- `p_value` as text: a JSON string of p_min to p_max characters (NUL and lone surrogates
-- cannot reach here: jsonb refuses them), at most p_max_bytes bytes of UTF-8.
CREATE FUNCTION enqueue_text(p_value jsonb, p_what text, p_min integer, p_max integer,
                             p_max_bytes integer)
RETURNS text
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    t text;
BEGIN
    IF jsonb_typeof(p_value) <> 'string' THEN
        PERFORM enqueue_refuse(p_what, format('must be a string, got %s', left(p_value::text, 60)));
    END IF;
    t := p_value #>> '{}';
    IF char_length(t) < p_min OR char_length(t) > p_max THEN
        PERFORM enqueue_refuse(p_what, format('must be %s to %s characters, got %s', p_min, p_max,
                                              char_length(t)));
    END IF;
    IF octet_length(t) > p_max_bytes THEN
        PERFORM enqueue_refuse(p_what, format('must be at most %s bytes in UTF-8, got %s',
                                              p_max_bytes, octet_length(t)));
    END IF;
    RETURN t;
END $$;

-- One job of the contract, checked, as the row the Python call would insert; its id is new.
-- Refuses anything the Python call refuses (InvalidInput there, 22023 here).
CREATE FUNCTION enqueue_checked(p_type text, p_payload jsonb, p_options jsonb)
RETURNS job
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    j job;
    k text;
    v jsonb;
    cap bigint := coalesce(nullif(current_setting('pgq_supervisor.max_payload_bytes', true), '')::bigint,
                           1048576);
BEGIN
    IF p_type IS NULL OR p_type !~ '^[^\s\x01-\x1f\x7f-\x9f]{1,100}$' OR p_type IN ('.', '..') THEN
        PERFORM enqueue_refuse('type', format(
            '%s is invalid: must be 1 to 100 characters without whitespace or control'
            ' characters, and not ''.'' or ''..''', coalesce(quote_literal(left(p_type, 40)),
                                                           'NULL')));
    END IF;
    IF p_options IS NULL OR jsonb_typeof(p_options) <> 'object' THEN
        PERFORM enqueue_refuse('options', 'must be a JSON object');
    END IF;
    IF octet_length(coalesce(p_payload, 'null'::jsonb)::text) > cap THEN
        PERFORM enqueue_refuse('payload', format(
            'is %s bytes of JSON, over the %s-byte cap (pgq_supervisor.max_payload_bytes)',
            octet_length(p_payload::text), cap));
    END IF;
    j.id := new_id();
    j.type := p_type;
    j.payload := CASE WHEN p_payload IS NULL OR p_payload = 'null' THEN '{}' ELSE p_payload END;
    j.priority := 0;
    j.start_at := now();
    j.on_dependency_failure := 'cancel';
    FOR k, v IN SELECT * FROM jsonb_each(p_options) LOOP
        CONTINUE WHEN jsonb_typeof(v) = 'null';
        CASE k
        WHEN 'priority' THEN
            j.priority := enqueue_int(v, 'priority', -2147483648, 2147483647);
        WHEN 'max_retry_count' THEN
            j.max_retry_count := enqueue_int(v, 'max_retry_count', 0, 2147483647);
        WHEN 'timeout' THEN
            IF jsonb_typeof(v) <> 'number' THEN
                PERFORM enqueue_refuse('timeout', format('must be a number of seconds, got %s',
                                                         left(v::text, 60)));
            END IF;
            IF (v #>> '{}')::numeric <= 0 OR (v #>> '{}')::numeric > 1e300 THEN
                PERFORM enqueue_refuse('timeout', format('must be > 0 seconds, got %s',
                                                         left(v::text, 60)));
            END IF;
            j.timeout := (v #>> '{}')::double precision;
        WHEN 'start_at' THEN
            IF jsonb_typeof(v) <> 'string'
               OR (v #>> '{}')
                  !~ '^\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d(:\d\d(\.\d+)?)?([zZ]|[+-]\d\d(:?\d\d)?)$'
            THEN
                PERFORM enqueue_refuse('start_at', format(
                    'must be a timestamp with a time zone (ISO 8601), got %s', left(v::text, 60)));
            END IF;
            BEGIN
                j.start_at := (v #>> '{}')::timestamptz;
            EXCEPTION WHEN data_exception THEN
                PERFORM enqueue_refuse('start_at', format(
                    'must be a timestamp with a time zone (ISO 8601), got %s', left(v::text, 60)));
            END;
        WHEN 'unique_key' THEN
            j.unique_key := enqueue_text(v, 'unique_key', 0, 1024, 1024);
        WHEN 'origin' THEN
            j.origin := enqueue_text(v, 'origin', 0, 1000, 4000);
        WHEN 'concurrency_key' THEN
            j.concurrency_key := enqueue_text(v, 'concurrency_key', 1, 200, 800);
        WHEN 'tenant' THEN
            j.tenant := enqueue_text(v, 'tenant', 1, 200, 800);
        WHEN 'on_dependency_failure' THEN
            IF v NOT IN ('"cancel"'::jsonb, '"run"'::jsonb) THEN
                PERFORM enqueue_refuse('on_dependency_failure', format(
                    'must be "cancel" or "run", got %s', left(v::text, 60)));
            END IF;
            j.on_dependency_failure := v #>> '{}';
        WHEN 'depends_on' THEN
            IF jsonb_typeof(v) <> 'array' THEN
                PERFORM enqueue_refuse('depends_on', 'must be an array of job ids');
            END IF;
            BEGIN
                SELECT array_agg(DISTINCT (e #>> '{}')::uuid) INTO j.depends_on
                FROM jsonb_array_elements(v) e;
            EXCEPTION WHEN invalid_text_representation THEN
                PERFORM enqueue_refuse('depends_on', format('must be an array of job ids, got %s',
                                                            left(v::text, 60)));
            END;
        WHEN 'unique_for', 'unique_states', 'replace', 'replace_running', 'ordered_key' THEN
            PERFORM enqueue_refuse(k, 'is not in version 1 of the SQL contract (the Python call'
                                      ' takes it)');
        ELSE
            PERFORM enqueue_refuse(format('option %s', quote_literal(k)), 'is unknown');
        END CASE;
    END LOOP;
    IF j.depends_on IS NULL THEN
        j.on_dependency_failure := NULL;
    END IF;
    j.waiting_on := coalesce(cardinality(j.depends_on), 0);
    RETURN j;
END $$;

-- Many jobs: a JSON array of {"type": …, "payload": …, "options": {…}}; ids in input order,
-- a job whose unique_key is held gets its holder's id. One statement inserts them all.
CREATE FUNCTION enqueue_many(p_jobs jsonb) RETURNS uuid[]
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    rows job[] := '{}';
    r job;
    e jsonb;
    keys text[] := '{}';
    out uuid[] := '{}';
    inserted uuid[];
    i integer;
BEGIN
    IF p_jobs IS NULL OR jsonb_typeof(p_jobs) <> 'array' THEN
        PERFORM enqueue_refuse('jobs', 'must be a JSON array of {"type", "payload", "options"}');
    END IF;
    FOR e IN SELECT x FROM jsonb_array_elements(p_jobs) x LOOP
        IF jsonb_typeof(e) <> 'object' OR EXISTS (
            SELECT 1 FROM jsonb_object_keys(e) key WHERE key NOT IN ('type', 'payload', 'options')
        ) THEN
            PERFORM enqueue_refuse('jobs', format(
                'item %s must be {"type": text, "payload": json, "options": {...}}, got %s',
                cardinality(rows) + 1, left(e::text, 60)));
        END IF;
        IF jsonb_typeof(e -> 'type') NOT IN ('string', 'null') THEN
            PERFORM enqueue_refuse('type', format('must be a string, got %s',
                                                  left((e -> 'type')::text, 60)));
        END IF;
        r := enqueue_checked(e ->> 'type', e -> 'payload', coalesce(e -> 'options', '{}'));
        IF r.unique_key = ANY(keys) THEN
            PERFORM enqueue_refuse('unique_key', format('%s appears twice in one batch',
                                                        quote_literal(r.unique_key)));
        END IF;
        keys := keys || r.unique_key;
        rows := rows || r;
    END LOOP;
    WITH ins AS (
        INSERT INTO job (id, type, payload, priority, start_at, max_retry_count, unique_key,
                         origin, timeout, depends_on, on_dependency_failure, waiting_on,
                         concurrency_key, tenant)
        SELECT x.id, x.type, x.payload, x.priority, x.start_at, x.max_retry_count, x.unique_key,
               x.origin, x.timeout, x.depends_on, x.on_dependency_failure, x.waiting_on,
               x.concurrency_key, x.tenant
        FROM unnest(rows) AS x
        RETURNING id
    )
    SELECT coalesce(array_agg(id), '{}') INTO inserted FROM ins;
    FOR i IN 1 .. cardinality(rows) LOOP
        r := rows[i];
        IF r.id = ANY(inserted) THEN
            out := out || r.id;
            IF r.depends_on IS NOT NULL THEN
                BEGIN
                    PERFORM link_dependencies(array_fill(r.id, ARRAY[cardinality(r.depends_on)]),
                                              r.depends_on);
                EXCEPTION WHEN SQLSTATE 'PGQ01' THEN  -- link_dependencies: no such job
                    PERFORM enqueue_refuse('depends_on:', SQLERRM);
                END;
            END IF;
        ELSE  -- its unique_key is held (job_unique_take dropped the row)
            out := out || (SELECT u.job_id FROM job_unique u WHERE u.unique_key = r.unique_key);
        END IF;
    END LOOP;
    RETURN out;
END $$;

CREATE FUNCTION enqueue(p_type text, p_payload jsonb DEFAULT '{}', p_options jsonb DEFAULT '{}')
RETURNS uuid
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT (enqueue_many(jsonb_build_array(jsonb_build_object(
        'type', p_type, 'payload', p_payload,
        'options', coalesce(p_options, '{}'::jsonb)))))[1]
$$;

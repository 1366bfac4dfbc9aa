# Written by hand: on PostgreSQL, runs.claim_many() takes every lock row of a batch before it
# writes a run (docs/backends/database.md, docs/decisions.md).
#
# Additive only: two new functions; the previous release never calls them and keeps calling
# anarchon_run_claim_many_v5 (or v4), and a release that finds them missing (migrations not
# applied yet) calls v5 (or v4).

from django.db import migrations

# anarchon_sweep_v1: v2's sweep of one job, before a new run of it is decided: every other
# running run whose lease lapsed by p_at and whose attempt reached its stored max_attempts
# becomes finished, interrupted (its attempt too, unless its runner saved a result).
SWEEP_V1 = r"""
CREATE OR REPLACE FUNCTION anarchon_sweep_v1(p_job text, p_slot bigint, p_at bigint)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_swept record;
BEGIN
    -- v2's sweep: one UPDATE re-checks each row under its row lock, so a heartbeat or
    -- finish that got there first keeps its run.
    FOR v_swept IN
        UPDATE django_anarchon_run r
            SET state = 'finished', status = 'interrupted', finished_at_ms = p_at
            WHERE r.job = p_job AND r.slot <> p_slot
                AND r.state = 'running' AND r.lease_until_ms <= p_at
                AND r.max_attempts IS NOT NULL AND r.attempt >= r.max_attempts
            RETURNING r.slot, r.instance_id, r.attempt, r.reason, r.started_at_ms
    LOOP
        UPDATE django_anarchon_runattempt a
            SET status = 'interrupted',
                finished_at = timestamptz 'epoch' + p_at * interval '1 millisecond',
                duration_ms = greatest(p_at - v_swept.started_at_ms, 0),
                error = 'lease lapsed; attempts used up'
            WHERE a.job = p_job AND a.slot = v_swept.slot
                AND a.instance_id = v_swept.instance_id
                AND a.attempt = v_swept.attempt
                AND a.manual = false AND a.status = 'running';
        IF NOT FOUND THEN
            -- Its claim was pruned meanwhile; a result its runner saved stays.
            INSERT INTO django_anarchon_runattempt (job, slot, scheduled_at,
                    instance_id, manual, attempt, reason, status, started_at,
                    finished_at, duration_ms, error)
                VALUES (p_job, v_swept.slot,
                    timestamptz 'epoch' + v_swept.slot * interval '1 millisecond',
                    v_swept.instance_id, false, v_swept.attempt, v_swept.reason,
                    'interrupted',
                    timestamptz 'epoch'
                        + v_swept.started_at_ms * interval '1 millisecond',
                    timestamptz 'epoch' + p_at * interval '1 millisecond',
                    greatest(p_at - v_swept.started_at_ms, 0),
                    'lease lapsed; attempts used up')
                ON CONFLICT (job, slot, instance_id, attempt, manual) DO NOTHING;
        END IF;
    END LOOP;
END
$$;
"""

# anarchon_run_claim_many_v6: what anarchon_run_claim_many_v5 answers (0010), with its locks
# in the lock path's order. v5 inserted a batch's runs, then locked their jobs' rows; the
# lock path (the database backend's Python, under the job's lock: an overlap that owes its
# ledger mark is decided there again) locks the job's row, then writes the run. Two
# claimers of one run in those two orders waited on each other in a circle until
# PostgreSQL's deadlock check (deadlock_timeout, a second by default) aborted one: a test
# with three instances on ten jobs every 300 ms met three in seven seconds. v6:
#   * locks the row of every job of the batch first (overlap "allow" too), in the batch's
#     order, creating those missing; then reads the server's now (a wait for the locks
#     never makes a claim judged in its window when it is not);
#   * then decides the batch's new runs set-based, as v5 (the sweep through
#     anarchon_sweep_v1, the same statements v5 ran);
#   * and the rest through one call of anarchon_run_claim_many_v4 on their claims, in the
#     batch's order, mapped back to the batch's indexes (v4's own locks are held already).
# The release calls it for single claims of new runs too (a batch of one), so that every
# claim this release sends takes a job's lock before it writes the job's run.
CLAIM_MANY_V6 = r"""
CREATE OR REPLACE FUNCTION anarchon_run_claim_many_v6(
    p_jobs text[], p_slots bigint[], p_tokens text[], p_instances text[], p_lease_ms bigint[],
    p_reasons text[], p_overlap_skip boolean[], p_max_late_ms bigint[], p_keep_ms bigint[],
    p_max_attempts integer[], p_default_keep_ms bigint, p_min_keep_ms bigint
) RETURNS TABLE (o_index integer, o_kind text, o_attempt integer, o_slot bigint,
                 o_now_ms bigint, o_marked boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now bigint;
    v_n integer := coalesce(array_length(p_jobs, 1), 0);
    v_at bigint;
    v_won integer[];
    v_ids bigint[];
    v_jobs text[];
    v_locked bigint;
    v_rest integer[];
    r_jobs text[];
    r_slots bigint[];
    r_tokens text[];
    r_instances text[];
    r_lease_ms bigint[];
    r_reasons text[];
    r_overlap_skip boolean[];
    r_max_late_ms bigint[];
    r_keep_ms bigint[];
    r_max_attempts integer[];
    v_done boolean[];
    v_gone integer[] := '{}';
    v_row record;
    w integer;
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    v_done := array_fill(false, ARRAY[v_n]);
    -- Every job's lock row first, in the batch's order (its first claim's), before any
    -- run is written: the lock path takes a job's lock, then writes its run, and so does
    -- every claim here (v4's too, below, whose lock is then held already). Writing runs
    -- first and locking after, as v5 did, waits in a circle with the lock path's claim of
    -- the same run (an overlap that owed its mark, decided again there).
    SELECT array_agg(k.job ORDER BY k.n) INTO v_jobs
        FROM (SELECT b.job, min(b.n) AS n FROM unnest(p_jobs) WITH ORDINALITY AS b(job, n)
              GROUP BY b.job) k;
    SELECT count(*) INTO v_locked FROM (
        SELECT 1 FROM django_anarchon_joblock l
            JOIN unnest(v_jobs) WITH ORDINALITY AS k(job, n) ON l.job = k.job
            ORDER BY k.n FOR UPDATE OF l) locked;
    IF v_locked < array_length(v_jobs, 1) THEN
        INSERT INTO django_anarchon_joblock (job, created_at)
            SELECT k.job, clock_timestamp()
            FROM unnest(v_jobs) WITH ORDINALITY AS k(job, n) ORDER BY k.n
            ON CONFLICT (job) DO NOTHING;
        PERFORM 1 FROM django_anarchon_joblock l
            JOIN unnest(v_jobs) WITH ORDINALITY AS k(job, n) ON l.job = k.job
            ORDER BY k.n FOR UPDATE OF l;
    END IF;
    -- The server's now once the locks are held: a wait for them never makes a claim
    -- judged in its window when it no longer is.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    -- EXECUTE: planned for this batch's arrays each time (a cached generic plan guessed
    -- their sizes and read every run and lock row of the tables instead).
    EXECUTE $q$
        WITH candidate AS (
            SELECT u.i::integer AS i, u.job, u.slot
            FROM (SELECT b.job, b.slot, b.i, count(*) OVER (PARTITION BY b.job) AS claims
                  FROM unnest($2, $3) WITH ORDINALITY AS b(job, slot, i)) u
            WHERE u.claims = 1
                AND $1 >= u.slot
                AND ($4[u.i] IS NULL OR $1 <= u.slot + $4[u.i])
                AND NOT EXISTS (SELECT 1 FROM django_anarchon_joblock l
                    WHERE l.job = u.job AND l.paused_at_ms IS NOT NULL
                        AND (l.paused_until_ms IS NULL OR l.paused_until_ms > $1))
                AND NOT EXISTS (SELECT 1 FROM django_anarchon_run r
                    WHERE r.job = u.job AND r.slot = u.slot)
        ), inserted AS (
            INSERT INTO django_anarchon_run (job, slot, attempt, token, instance_id,
                    lease_until_ms, state, status, reason, manual, started_at_ms,
                    finished_at_ms, keep_ms, max_attempts)
                SELECT c.job, c.slot, 1, $5[c.i], $6[c.i], $1 + $7[c.i], 'running', NULL,
                    $8[c.i], false, $1, NULL, $9[c.i], $10[c.i]
                FROM candidate c ORDER BY c.i
                ON CONFLICT (job, slot) DO NOTHING
                RETURNING id, job, slot
        )
        SELECT array_agg(c.i ORDER BY c.i), array_agg(ins.id ORDER BY c.i)
            FROM inserted ins JOIN candidate c ON c.job = ins.job AND c.slot = ins.slot
    $q$ INTO v_won, v_ids
    USING v_now, p_jobs, p_slots, p_max_late_ms, p_tokens, p_instances, p_lease_ms,
        p_reasons, p_keep_ms, p_max_attempts;
    IF v_won IS NOT NULL THEN
        FOREACH w IN ARRAY v_won LOOP
            v_done[w] := true;
        END LOOP;
        v_at := v_now;
        -- One read of their jobs' other running runs: per run won, the newest live one
        -- (overlap) and whether any is lapsed with its attempts used up (the sweep).
        FOR v_row IN EXECUTE $q$
            SELECT k.w, max(r.slot) FILTER (WHERE r.lease_until_ms > $1) AS busy,
                    coalesce(bool_or(r.lease_until_ms <= $1 AND r.max_attempts IS NOT NULL
                        AND r.attempt >= r.max_attempts), false) AS sweep
                FROM unnest($2) AS k(w)
                JOIN django_anarchon_run r ON r.job = $3[k.w] AND r.slot <> $4[k.w]
                    AND r.state = 'running'
                GROUP BY k.w ORDER BY k.w
        $q$ USING v_at, v_won, p_jobs, p_slots
        LOOP
            IF v_row.sweep THEN
                PERFORM anarchon_sweep_v1(p_jobs[v_row.w], p_slots[v_row.w], v_at);
            END IF;
            IF p_overlap_skip[v_row.w] AND v_row.busy IS NOT NULL THEN
                DELETE FROM django_anarchon_run
                    WHERE id = v_ids[array_position(v_won, v_row.w)];
                v_gone := v_gone || v_row.w;
                o_index := v_row.w;
                o_kind := 'overlap';
                o_attempt := NULL;
                o_slot := v_row.busy;
                o_now_ms := v_now;
                o_marked := EXISTS (SELECT 1 FROM django_anarchon_ledgermark m
                    WHERE m.job = p_jobs[v_row.w] AND m.slot = p_slots[v_row.w]);
                RETURN NEXT;
            END IF;
        END LOOP;
        INSERT INTO django_anarchon_runattempt (job, slot, scheduled_at, instance_id, manual,
                attempt, reason, status, started_at, finished_at, duration_ms, error)
            SELECT p_jobs[k.w], p_slots[k.w],
                timestamptz 'epoch' + p_slots[k.w] * interval '1 millisecond',
                p_instances[k.w], false, 1, p_reasons[k.w], 'running',
                timestamptz 'epoch' + v_now * interval '1 millisecond', NULL, NULL, NULL
            FROM unnest(v_won) AS k(w) WHERE NOT (k.w = ANY(v_gone)) ORDER BY k.w
            ON CONFLICT (job, slot, instance_id, attempt, manual) DO UPDATE SET
                reason = EXCLUDED.reason, status = 'running',
                started_at = EXCLUDED.started_at, finished_at = NULL, duration_ms = NULL,
                error = NULL;
        RETURN QUERY SELECT k.w, 'won'::text, 1, NULL::bigint, v_now, false
            FROM unnest(v_won) AS k(w) WHERE NOT (k.w = ANY(v_gone));
    END IF;
    -- The rest as v4 decides them, in the batch's order, in one call.
    SELECT array_agg(k.i ORDER BY k.i), array_agg(p_jobs[k.i] ORDER BY k.i),
            array_agg(p_slots[k.i] ORDER BY k.i), array_agg(p_tokens[k.i] ORDER BY k.i),
            array_agg(p_instances[k.i] ORDER BY k.i), array_agg(p_lease_ms[k.i] ORDER BY k.i),
            array_agg(p_reasons[k.i] ORDER BY k.i),
            array_agg(p_overlap_skip[k.i] ORDER BY k.i),
            array_agg(p_max_late_ms[k.i] ORDER BY k.i), array_agg(p_keep_ms[k.i] ORDER BY k.i),
            array_agg(p_max_attempts[k.i] ORDER BY k.i)
        INTO v_rest, r_jobs, r_slots, r_tokens, r_instances, r_lease_ms, r_reasons,
            r_overlap_skip, r_max_late_ms, r_keep_ms, r_max_attempts
        FROM generate_subscripts(p_jobs, 1) AS k(i) WHERE NOT v_done[k.i];
    IF v_rest IS NOT NULL THEN
        RETURN QUERY SELECT v_rest[m.o_index], m.o_kind, m.o_attempt, m.o_slot, m.o_now_ms,
                m.o_marked
            FROM anarchon_run_claim_many_v4(r_jobs, r_slots, r_tokens, r_instances,
                r_lease_ms, r_reasons, r_overlap_skip, r_max_late_ms, r_keep_ms,
                r_max_attempts, p_default_keep_ms, p_min_keep_ms) AS m;
    END IF;
END
$$;
"""

_DROP = (
    "DROP FUNCTION IF EXISTS anarchon_run_claim_many_v6(text[], bigint[], text[], text[], "
    "bigint[], text[], boolean[], bigint[], bigint[], integer[], bigint, bigint)",
    "DROP FUNCTION IF EXISTS anarchon_sweep_v1(text, bigint, bigint)",
)


def create_functions(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(SWEEP_V1)
        schema_editor.execute(CLAIM_MANY_V6)


def drop_functions(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in _DROP:
            schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ('django_anarchon', '0010_run_claim_many_v5'),
    ]

    operations = [
        migrations.RunPython(create_functions, drop_functions, elidable=False),
    ]

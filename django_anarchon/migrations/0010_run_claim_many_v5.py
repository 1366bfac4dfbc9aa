# Written by hand: on PostgreSQL, runs.claim_many() decides a batch's new runs together
# (docs/backends/database.md, docs/decisions.md, docs/benchmarks.md).
#
# Additive only: one new function; the previous release never calls it and keeps calling
# anarchon_run_claim_many_v4, and a release that finds it missing (migrations not applied
# yet) calls v4 too.

from django.db import migrations

# anarchon_run_claim_many_v5: what anarchon_run_claim_many_v4 answers, with the common case
# of a burst decided set-based instead of one nested function call per claim (about
# 170 us of the server's CPU per new run, of which the statements that write are 70):
#   * the claims decided together: a new run in its window by the server's clock (from its
#     slot to slot + max_late), of a job not paused, whose job has no other claim in the
#     batch (a job's slots in one batch would each see the other's run: they go one by one,
#     as before). Their runs are inserted in one INSERT ... ON CONFLICT (job, slot) DO
#     NOTHING, in the batch's order (the caller's (job, slot) order), so that the batches
#     of two instances wait on each other's uncommitted runs in one order; losers wait for
#     the winner's transaction, as in v2;
#   * for the runs inserted: the lock rows of their jobs with overlap "skip" (created if
#     missing), in the batch's order; then, each statement on a fresh snapshot (READ
#     COMMITTED), one read of their jobs' other running runs, per run the newest live one
#     and whether one is lapsed with its attempts used up; the sweep of those jobs, as v2
#     does it; with "skip" and a live run, the run inserted is deleted again and answered
#     'overlap' (with o_marked as v3 says it); the others' history rows in one INSERT, and
#     'won' (attempt 1);
#   * every other claim (the insert met a run, or not in the window, a paused job, a job
#     twice in the batch) then goes to anarchon_run_claim_v4 one by one, in the batch's
#     order, exactly as before.
# Times: one server now for the batch (the leases start there); v_at after the locks.
CLAIM_MANY_V5 = r"""
CREATE OR REPLACE FUNCTION anarchon_run_claim_many_v5(
    p_jobs text[], p_slots bigint[], p_tokens text[], p_instances text[], p_lease_ms bigint[],
    p_reasons text[], p_overlap_skip boolean[], p_max_late_ms bigint[], p_keep_ms bigint[],
    p_max_attempts integer[], p_default_keep_ms bigint, p_min_keep_ms bigint
) RETURNS TABLE (o_index integer, o_kind text, o_attempt integer, o_slot bigint,
                 o_now_ms bigint, o_marked boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_n integer := coalesce(array_length(p_jobs, 1), 0);
    v_at bigint;
    v_won integer[];
    v_ids bigint[];
    v_lock text[];
    v_locked bigint;
    v_done boolean[];
    v_gone integer[] := '{}';
    v_row record;
    v_swept record;
    v_result record;
    w integer;
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    v_done := array_fill(false, ARRAY[v_n]);
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
        -- Other slots of these jobs: their claims take turns on the jobs' lock rows.
        SELECT array_agg(p_jobs[k.w] ORDER BY k.w) INTO v_lock
            FROM unnest(v_won) AS k(w) WHERE p_overlap_skip[k.w];
        IF v_lock IS NOT NULL THEN
            SELECT count(*) INTO v_locked FROM (
                SELECT 1 FROM django_anarchon_joblock l
                    JOIN unnest(v_lock) WITH ORDINALITY AS k(job, n) ON l.job = k.job
                    ORDER BY k.n FOR UPDATE OF l) locked;
            IF v_locked < array_length(v_lock, 1) THEN
                INSERT INTO django_anarchon_joblock (job, created_at)
                    SELECT k.job, clock_timestamp()
                    FROM unnest(v_lock) WITH ORDINALITY AS k(job, n) ORDER BY k.n
                    ON CONFLICT (job) DO NOTHING;
                PERFORM 1 FROM django_anarchon_joblock l
                    JOIN unnest(v_lock) WITH ORDINALITY AS k(job, n) ON l.job = k.job
                    ORDER BY k.n FOR UPDATE OF l;
            END IF;
        END IF;
        v_at := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
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
                -- v2's sweep: one UPDATE re-checks each row under its row lock, so a
                -- heartbeat or finish that got there first keeps its run.
                FOR v_swept IN
                    UPDATE django_anarchon_run r
                        SET state = 'finished', status = 'interrupted', finished_at_ms = v_at
                        WHERE r.job = p_jobs[v_row.w] AND r.slot <> p_slots[v_row.w]
                            AND r.state = 'running' AND r.lease_until_ms <= v_at
                            AND r.max_attempts IS NOT NULL AND r.attempt >= r.max_attempts
                        RETURNING r.slot, r.instance_id, r.attempt, r.reason, r.started_at_ms
                LOOP
                    UPDATE django_anarchon_runattempt a
                        SET status = 'interrupted',
                            finished_at = timestamptz 'epoch' + v_at * interval '1 millisecond',
                            duration_ms = greatest(v_at - v_swept.started_at_ms, 0),
                            error = 'lease lapsed; attempts used up'
                        WHERE a.job = p_jobs[v_row.w] AND a.slot = v_swept.slot
                            AND a.instance_id = v_swept.instance_id
                            AND a.attempt = v_swept.attempt
                            AND a.manual = false AND a.status = 'running';
                    IF NOT FOUND THEN
                        -- Its claim was pruned meanwhile; a result its runner saved stays.
                        INSERT INTO django_anarchon_runattempt (job, slot, scheduled_at,
                                instance_id, manual, attempt, reason, status, started_at,
                                finished_at, duration_ms, error)
                            VALUES (p_jobs[v_row.w], v_swept.slot,
                                timestamptz 'epoch' + v_swept.slot * interval '1 millisecond',
                                v_swept.instance_id, false, v_swept.attempt, v_swept.reason,
                                'interrupted',
                                timestamptz 'epoch'
                                    + v_swept.started_at_ms * interval '1 millisecond',
                                timestamptz 'epoch' + v_at * interval '1 millisecond',
                                greatest(v_at - v_swept.started_at_ms, 0),
                                'lease lapsed; attempts used up')
                            ON CONFLICT (job, slot, instance_id, attempt, manual) DO NOTHING;
                    END IF;
                END LOOP;
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
    FOR i IN 1 .. v_n LOOP
        CONTINUE WHEN v_done[i];
        SELECT * INTO v_result FROM anarchon_run_claim_v4(p_jobs[i], p_slots[i], p_tokens[i],
            p_instances[i], p_lease_ms[i], p_reasons[i], p_overlap_skip[i], p_max_late_ms[i],
            p_keep_ms[i], p_max_attempts[i], p_default_keep_ms, p_min_keep_ms);
        o_index := i;
        o_kind := v_result.o_kind;
        o_attempt := v_result.o_attempt;
        o_slot := v_result.o_slot;
        o_now_ms := v_result.o_now_ms;
        o_marked := v_result.o_marked;
        RETURN NEXT;
    END LOOP;
END
$$;
"""


def create_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CLAIM_MANY_V5)


def drop_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS anarchon_run_claim_many_v5(text[], bigint[], text[], "
            "text[], bigint[], text[], boolean[], bigint[], bigint[], integer[], bigint, bigint)"
        )


class Migration(migrations.Migration):

    dependencies = [
        ('django_anarchon', '0009_finish_many_run_claim_v4'),
    ]

    operations = [
        migrations.RunPython(create_function, drop_function, elidable=False),
    ]

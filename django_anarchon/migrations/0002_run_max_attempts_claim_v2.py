# Written by hand: Run.max_attempts, and the PostgreSQL claim functions of the lease rules
# of SPEC section 9 (docs/backends/database.md).

from django.db import migrations, models

# anarchon_run_claim_v2 / anarchon_run_claim_many_v2: runs.claim() with mode "new", as v1
# (0001_initial.py) plus the rules of SPEC section 9, still in one round trip:
#   * early: no run and the slot has not come by the server's clock -> 'early', nothing
#     written (the insert happens only from the slot on);
#   * the sweep: a new run, once inserted, ends every other running run of the job whose
#     lease lapsed and whose attempt reached its stored max_attempts (finished,
#     interrupted, its attempt recorded as such unless its runner saved a result), before
#     the overlap check; rows with a null max_attempts (the previous release) are left alone;
#   * keep_ms and max_attempts only grow, also on a 'running' answer (an UPDATE only when
#     the claim carries a larger value).
# Everything else (takeover, retry, done, a finished run that may be forgotten) is 'other'
# and takes the general lock path in Python. The v1 functions stay installed: during a
# rolling deploy the previous release still calls them (its rows have a null max_attempts).
CLAIM_FUNCTIONS_V2 = r"""
CREATE OR REPLACE FUNCTION anarchon_run_claim_v2(
    p_job text, p_slot bigint, p_token text, p_instance text, p_lease_ms bigint,
    p_reason text, p_overlap_skip boolean, p_max_late_ms bigint, p_keep_ms bigint,
    p_max_attempts integer
) RETURNS TABLE (o_kind text, o_attempt integer, o_slot bigint, o_now_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_at bigint;
    v_id bigint;
    v_busy bigint;
    v_sweep boolean;
    v_run record;
    v_swept record;
BEGIN
    IF v_now >= p_slot AND (p_max_late_ms IS NULL OR v_now <= p_slot + p_max_late_ms) THEN
        -- The unique (job, slot) decides among claimers of this run: losers wait for the
        -- winner's transaction, all at once, then find its row below.
        INSERT INTO django_anarchon_run (job, slot, attempt, token, instance_id, lease_until_ms,
                state, status, reason, manual, started_at_ms, finished_at_ms, keep_ms,
                max_attempts)
            VALUES (p_job, p_slot, 1, p_token, p_instance, v_now + p_lease_ms, 'running',
                NULL, p_reason, false, v_now, NULL, p_keep_ms, p_max_attempts)
            ON CONFLICT (job, slot) DO NOTHING
            RETURNING id INTO v_id;
        IF v_id IS NOT NULL THEN
            IF p_overlap_skip THEN
                -- Other slots of the job: their claims take turns on the job's lock row.
                PERFORM 1 FROM django_anarchon_joblock l WHERE l.job = p_job FOR UPDATE;
                IF NOT FOUND THEN
                    INSERT INTO django_anarchon_joblock (job, created_at)
                        VALUES (p_job, clock_timestamp()) ON CONFLICT (job) DO NOTHING;
                    PERFORM 1 FROM django_anarchon_joblock l WHERE l.job = p_job FOR UPDATE;
                END IF;
            END IF;
            v_at := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
            -- One read of the job's other running runs: the newest live one (overlap) and
            -- whether any is lapsed with its attempts used up (the sweep).
            SELECT max(r.slot) FILTER (WHERE r.lease_until_ms > v_at),
                    coalesce(bool_or(r.lease_until_ms <= v_at AND r.max_attempts IS NOT NULL
                        AND r.attempt >= r.max_attempts), false)
                INTO v_busy, v_sweep
                FROM django_anarchon_run r
                WHERE r.job = p_job AND r.slot <> p_slot AND r.state = 'running';
            -- The sweep: one UPDATE re-checks each row under its row lock, so a heartbeat
            -- or finish that got there first keeps its run.
            IF v_sweep THEN
                FOR v_swept IN
                    UPDATE django_anarchon_run r
                        SET state = 'finished', status = 'interrupted', finished_at_ms = v_at
                        WHERE r.job = p_job AND r.slot <> p_slot AND r.state = 'running'
                            AND r.lease_until_ms <= v_at AND r.max_attempts IS NOT NULL
                            AND r.attempt >= r.max_attempts
                        RETURNING r.slot, r.instance_id, r.attempt, r.reason, r.started_at_ms
                LOOP
                    UPDATE django_anarchon_runattempt a
                        SET status = 'interrupted',
                            finished_at = timestamptz 'epoch' + v_at * interval '1 millisecond',
                            duration_ms = greatest(v_at - v_swept.started_at_ms, 0),
                            error = 'lease lapsed; attempts used up'
                        WHERE a.job = p_job AND a.slot = v_swept.slot
                            AND a.instance_id = v_swept.instance_id AND a.attempt = v_swept.attempt
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
                                timestamptz 'epoch' + v_at * interval '1 millisecond',
                                greatest(v_at - v_swept.started_at_ms, 0),
                                'lease lapsed; attempts used up')
                            ON CONFLICT (job, slot, instance_id, attempt, manual) DO NOTHING;
                    END IF;
                END LOOP;
            END IF;
            IF p_overlap_skip AND v_busy IS NOT NULL THEN
                DELETE FROM django_anarchon_run WHERE id = v_id;
                RETURN QUERY SELECT 'overlap'::text, NULL::integer, v_busy, v_now;
                RETURN;
            END IF;
            INSERT INTO django_anarchon_runattempt (job, slot, scheduled_at, instance_id, manual,
                    attempt, reason, status, started_at, finished_at, duration_ms, error)
                VALUES (p_job, p_slot, timestamptz 'epoch' + p_slot * interval '1 millisecond',
                    p_instance, false, 1, p_reason, 'running',
                    timestamptz 'epoch' + v_now * interval '1 millisecond', NULL, NULL, NULL)
                ON CONFLICT (job, slot, instance_id, attempt, manual) DO UPDATE SET
                    reason = EXCLUDED.reason, status = 'running',
                    started_at = EXCLUDED.started_at, finished_at = NULL, duration_ms = NULL,
                    error = NULL;
            RETURN QUERY SELECT 'won'::text, 1, NULL::bigint, v_now;
            RETURN;
        END IF;
    END IF;
    SELECT r.id, r.state, r.token, r.attempt, r.lease_until_ms, r.keep_ms, r.max_attempts
        INTO v_run FROM django_anarchon_run r WHERE r.job = p_job AND r.slot = p_slot;
    IF NOT FOUND THEN
        IF v_now < p_slot THEN
            RETURN QUERY SELECT 'early'::text, NULL::integer, NULL::bigint, v_now;
            RETURN;
        END IF;
        IF p_max_late_ms IS NOT NULL AND v_now > p_slot + p_max_late_ms THEN
            RETURN QUERY SELECT 'late'::text, NULL::integer, NULL::bigint, v_now;
            RETURN;
        END IF;
        RETURN QUERY SELECT 'other'::text, NULL::integer, NULL::bigint, v_now;
        RETURN;
    END IF;
    IF v_run.state = 'running' AND v_run.token = p_token THEN
        -- The same claim again: renew, unless a takeover replaced the token meanwhile.
        -- greatest() skips nulls: keep_ms and max_attempts only grow.
        UPDATE django_anarchon_run
            SET lease_until_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
                + p_lease_ms, keep_ms = greatest(keep_ms, p_keep_ms),
                max_attempts = greatest(max_attempts, p_max_attempts)
            WHERE id = v_run.id AND token = p_token AND state = 'running';
        IF FOUND THEN
            RETURN QUERY SELECT 'won'::text, v_run.attempt::integer, NULL::bigint, v_now;
            RETURN;
        END IF;
    ELSIF v_run.state = 'running' AND v_run.lease_until_ms > v_now THEN
        IF (p_keep_ms IS NOT NULL AND (v_run.keep_ms IS NULL OR v_run.keep_ms < p_keep_ms))
                OR (p_max_attempts IS NOT NULL AND (v_run.max_attempts IS NULL
                    OR v_run.max_attempts < p_max_attempts)) THEN
            -- Rare (the job's options changed): a backup told 'running' may take the run
            -- over later with more attempts, so the sweep must know them.
            UPDATE django_anarchon_run
                SET keep_ms = greatest(keep_ms, p_keep_ms),
                    max_attempts = greatest(max_attempts, p_max_attempts)
                WHERE id = v_run.id;
        END IF;
        RETURN QUERY SELECT 'running'::text, v_run.attempt::integer, NULL::bigint, v_now;
        RETURN;
    END IF;
    RETURN QUERY SELECT 'other'::text, NULL::integer, NULL::bigint, v_now;
END
$$;

CREATE OR REPLACE FUNCTION anarchon_run_claim_many_v2(
    p_jobs text[], p_slots bigint[], p_tokens text[], p_instances text[], p_lease_ms bigint[],
    p_reasons text[], p_overlap_skip boolean[], p_max_late_ms bigint[], p_keep_ms bigint[],
    p_max_attempts integer[]
) RETURNS TABLE (o_index integer, o_kind text, o_attempt integer, o_slot bigint, o_now_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_result record;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_jobs, 1), 0) LOOP
        SELECT * INTO v_result FROM anarchon_run_claim_v2(p_jobs[i], p_slots[i], p_tokens[i],
            p_instances[i], p_lease_ms[i], p_reasons[i], p_overlap_skip[i], p_max_late_ms[i],
            p_keep_ms[i], p_max_attempts[i]);
        o_index := i;
        o_kind := v_result.o_kind;
        o_attempt := v_result.o_attempt;
        o_slot := v_result.o_slot;
        o_now_ms := v_result.o_now_ms;
        RETURN NEXT;
    END LOOP;
END
$$;
"""


def create_claim_functions_v2(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CLAIM_FUNCTIONS_V2)


def drop_claim_functions_v2(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS anarchon_run_claim_many_v2(text[], bigint[], text[], "
            "text[], bigint[], text[], boolean[], bigint[], bigint[], integer[])"
        )
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS anarchon_run_claim_v2"
            "(text, bigint, text, text, bigint, text, boolean, bigint, bigint, integer)"
        )


class Migration(migrations.Migration):

    dependencies = [
        ('django_anarchon', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='max_attempts',
            field=models.PositiveIntegerField(blank=True, help_text='The largest max_attempts any claim of the run carried.', null=True, verbose_name='max attempts'),
        ),
        migrations.RunPython(create_claim_functions_v2, drop_claim_functions_v2, elidable=False),
    ]

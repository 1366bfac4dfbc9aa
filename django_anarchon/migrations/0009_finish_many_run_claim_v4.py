# Written by hand: on PostgreSQL, runs.finish_many() in one round trip, and the run-claim
# functions v4, which answer 'done' for a finished run themselves (docs/backends/database.md,
# docs/decisions.md).
#
# Additive only: new functions; the previous release never calls them and keeps calling v3,
# and a release that finds them missing (migrations not applied yet) ends runs through the
# ORM and claims through v3, as before.

from django.db import migrations

# anarchon_finish_many_v1: the ends of several attempts in one transaction, as
# Store.finish_many does them through the ORM, statement for statement:
#   * each end, in the order given (the caller sorts by job, slot, so that two instances'
#     batches never wait on each other in a circle): the run is finished if it is running
#     with the end's token, or already finished by it with this status or 'interrupted' (a
#     repeat after a lost reply, or the store's sweep); o_finished says whether it was;
#   * where it was, the attempt's history record is written over its claim's (the claim's
#     reason stays);
#   * then each job that had a record is pruned once, with the last of its ends' limits:
#     the newest p_history_size attempts stay, none older than p_history_ttl_ms (NULL: no
#     limit), and finished runs past forget_after_ms are forgotten.
# Times of the record are the runner's (epoch ms); the finish time of the run, the ttl and
# the forgetting go by the server's clock, as through the ORM.
FINISH_MANY_V1 = r"""
CREATE OR REPLACE FUNCTION anarchon_finish_many_v1(
    p_jobs text[], p_slots bigint[], p_tokens text[], p_statuses text[], p_instances text[],
    p_attempts integer[], p_manual boolean[], p_reasons text[], p_started_ms bigint[],
    p_finished_ms bigint[], p_duration_ms bigint[], p_errors text[],
    p_history_size integer[], p_history_ttl_ms bigint[], p_default_keep_ms bigint,
    p_min_keep_ms bigint
) RETURNS TABLE (o_index integer, o_finished boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_n integer := coalesce(array_length(p_jobs, 1), 0);
    v_done boolean[] := array_fill(false, ARRAY[v_n]);
    v_last integer[] := '{}';
    v_now bigint;
    v_size integer;
    v_ttl bigint;
    v_job text;
    v_i integer;
BEGIN
    FOR i IN 1 .. v_n LOOP
        UPDATE django_anarchon_run r
            SET finished_at_ms = coalesce(r.finished_at_ms,
                    floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint),
                state = 'finished', status = p_statuses[i]
            WHERE r.job = p_jobs[i] AND r.slot = p_slots[i] AND r.token = p_tokens[i]
                AND (r.state = 'running'
                    OR (r.state = 'finished' AND r.status IN (p_statuses[i], 'interrupted')));
        IF FOUND THEN
            v_done[i] := true;
            INSERT INTO django_anarchon_runattempt (job, slot, scheduled_at, instance_id, manual,
                    attempt, reason, status, started_at, finished_at, duration_ms, error)
                VALUES (p_jobs[i], p_slots[i],
                    timestamptz 'epoch' + p_slots[i] * interval '1 millisecond',
                    p_instances[i], p_manual[i], p_attempts[i], p_reasons[i], p_statuses[i],
                    timestamptz 'epoch' + p_started_ms[i] * interval '1 millisecond',
                    timestamptz 'epoch' + p_finished_ms[i] * interval '1 millisecond',
                    p_duration_ms[i], p_errors[i])
                ON CONFLICT (job, slot, instance_id, attempt, manual) DO UPDATE SET
                    status = EXCLUDED.status, started_at = EXCLUDED.started_at,
                    finished_at = EXCLUDED.finished_at, duration_ms = EXCLUDED.duration_ms,
                    error = EXCLUDED.error;
            -- The jobs arrive sorted: a job's last end is the one before the next job's.
            IF cardinality(v_last) > 0 AND p_jobs[v_last[cardinality(v_last)]] = p_jobs[i] THEN
                v_last[cardinality(v_last)] := i;
            ELSE
                v_last := v_last || i;
            END IF;
        END IF;
    END LOOP;
    FOREACH v_i IN ARRAY v_last LOOP
        v_job := p_jobs[v_i];
        v_size := p_history_size[v_i];
        v_ttl := p_history_ttl_ms[v_i];
        IF v_size <= 0 THEN
            DELETE FROM django_anarchon_runattempt a WHERE a.job = v_job;
        ELSE
            DELETE FROM django_anarchon_runattempt a WHERE a.id IN (
                SELECT k.id FROM django_anarchon_runattempt k WHERE k.job = v_job
                    ORDER BY k.started_at DESC, k.slot DESC, k.attempt DESC, k.id DESC
                    OFFSET v_size);
        END IF;
        v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        IF v_ttl IS NOT NULL THEN
            DELETE FROM django_anarchon_runattempt a WHERE a.job = v_job
                AND (a.finished_at < timestamptz 'epoch' + (v_now - v_ttl) * interval '1 millisecond'
                    OR (a.finished_at IS NULL AND a.started_at
                        < timestamptz 'epoch' + (v_now - v_ttl) * interval '1 millisecond'));
        END IF;
        DELETE FROM django_anarchon_run r WHERE r.job = v_job AND r.state = 'finished'
            AND greatest(coalesce(r.finished_at_ms, r.slot), r.slot)
                + greatest(coalesce(r.keep_ms, p_default_keep_ms), p_min_keep_ms) < v_now;
    END LOOP;
    RETURN QUERY SELECT g.i, v_done[g.i] FROM generate_series(1, v_n) AS g(i);
END
$$;
"""


# anarchon_run_claim_v4 / anarchon_run_claim_many_v4: what v3 answers, with the claims
# that meet a run already there answered first, from that run's row alone:
#   * another claimer's live lease: 'running' (keep_ms and max_attempts still only grow);
#   * a run won through claim(), or a finished run that the store still remembers (the
#     server's now is not past its forget_after_ms) and that this claim may not retry (it
#     succeeded, or its attempt reached the claim's max_attempts): 'done'.
# Everything else (no run yet, the same token, a lapsed lease, a retry, a run that may be
# forgotten) goes to v3 as before. A burst's losers are most of its claims: v3 answered
# them through v2's insert attempt, each a level deeper, and sent 'done' to the general
# lock path (a transaction on the job's lock row), since the losers ask after the winners
# of instant runs have finished.
CLAIM_FUNCTIONS_V4 = r"""
CREATE OR REPLACE FUNCTION anarchon_run_claim_v4(
    p_job text, p_slot bigint, p_token text, p_instance text, p_lease_ms bigint,
    p_reason text, p_overlap_skip boolean, p_max_late_ms bigint, p_keep_ms bigint,
    p_max_attempts integer, p_default_keep_ms bigint, p_min_keep_ms bigint
) RETURNS TABLE (o_kind text, o_attempt integer, o_slot bigint, o_now_ms bigint,
                 o_marked boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_run record;
    v_now bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_kind text;
BEGIN
    SELECT r.id, r.state, r.status, r.token, r.attempt, r.slot, r.lease_until_ms,
            r.finished_at_ms, r.keep_ms, r.max_attempts
        INTO v_run FROM django_anarchon_run r WHERE r.job = p_job AND r.slot = p_slot;
    IF FOUND THEN
        IF v_run.state = 'claimed' THEN
            v_kind := 'done';
        ELSIF v_run.state = 'running' AND v_run.token <> p_token
                AND v_run.lease_until_ms > v_now THEN
            v_kind := 'running';
        ELSIF v_run.state = 'finished'
                AND v_now <= greatest(coalesce(v_run.finished_at_ms, v_run.slot), v_run.slot)
                    + greatest(coalesce(v_run.keep_ms, p_default_keep_ms), p_min_keep_ms)
                AND NOT (v_run.status IN ('failed', 'interrupted')
                    AND v_run.attempt < p_max_attempts) THEN
            v_kind := 'done';
        END IF;
        IF v_kind IS NOT NULL THEN
            IF v_run.state <> 'claimed' AND ((p_keep_ms IS NOT NULL
                    AND (v_run.keep_ms IS NULL OR v_run.keep_ms < p_keep_ms))
                OR (p_max_attempts IS NOT NULL AND (v_run.max_attempts IS NULL
                    OR v_run.max_attempts < p_max_attempts))) THEN
                -- Rare (the job's options changed): a backup told 'running' may take the
                -- run over later with more attempts, so the sweep must know them.
                UPDATE django_anarchon_run
                    SET keep_ms = greatest(keep_ms, p_keep_ms),
                        max_attempts = greatest(max_attempts, p_max_attempts)
                    WHERE id = v_run.id;
            END IF;
            RETURN QUERY SELECT v_kind,
                CASE WHEN v_kind = 'running' THEN v_run.attempt::integer END,
                NULL::bigint, v_now, false;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM anarchon_run_claim_v3(p_job, p_slot, p_token, p_instance,
        p_lease_ms, p_reason, p_overlap_skip, p_max_late_ms, p_keep_ms, p_max_attempts);
END
$$;

CREATE OR REPLACE FUNCTION anarchon_run_claim_many_v4(
    p_jobs text[], p_slots bigint[], p_tokens text[], p_instances text[], p_lease_ms bigint[],
    p_reasons text[], p_overlap_skip boolean[], p_max_late_ms bigint[], p_keep_ms bigint[],
    p_max_attempts integer[], p_default_keep_ms bigint, p_min_keep_ms bigint
) RETURNS TABLE (o_index integer, o_kind text, o_attempt integer, o_slot bigint,
                 o_now_ms bigint, o_marked boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_result record;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_jobs, 1), 0) LOOP
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


def create_functions(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FINISH_MANY_V1)
        schema_editor.execute(CLAIM_FUNCTIONS_V4)


def drop_functions(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS anarchon_run_claim_many_v4(text[], bigint[], text[], "
            "text[], bigint[], text[], boolean[], bigint[], bigint[], integer[], bigint, bigint)"
        )
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS anarchon_run_claim_v4"
            "(text, bigint, text, text, bigint, text, boolean, bigint, bigint, integer, bigint, "
            "bigint)"
        )
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS anarchon_finish_many_v1(text[], bigint[], text[], text[], "
            "text[], integer[], boolean[], text[], bigint[], bigint[], bigint[], text[], "
            "integer[], bigint[], bigint, bigint)"
        )


class Migration(migrations.Migration):

    dependencies = [
        ('django_anarchon', '0008_run_claim_v3_pauses'),
    ]

    operations = [
        migrations.RunPython(create_functions, drop_functions, elidable=False),
    ]

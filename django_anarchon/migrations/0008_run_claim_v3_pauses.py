# Written by hand: on PostgreSQL, the v3 run-claim functions, which wrap v2 (0002,
# unchanged) with the ledger's rules (docs/backends/database.md, docs/decisions.md).
#
# Additive only: two new functions; the previous release never calls them and keeps
# calling v1/v2, which stay as they are.

from django.db import migrations

# anarchon_run_claim_v3 / anarchon_run_claim_many_v3: what v2 answers, except
#   * a job whose pause is in force (paused_at_ms set, paused_until_ms null or later than
#     the server's now) never reaches v2: 'paused', nothing written; the caller's lock
#     path then answers it and writes the mark;
#   * o_marked: on 'late' and 'overlap', whether the slot has a ledger mark already (a
#     skip that owes no mark may be answered at once; one that owes it goes to the lock
#     path, where the mark is written in the decision's transaction).
# A PL/pgSQL function keeps the plans of its statements for the session: the pause check
# costs an index probe, not the planning of a larger statement on every call (Django
# connects with psycopg's prepared statements off).
CLAIM_FUNCTIONS_V3 = r"""
CREATE OR REPLACE FUNCTION anarchon_run_claim_v3(
    p_job text, p_slot bigint, p_token text, p_instance text, p_lease_ms bigint,
    p_reason text, p_overlap_skip boolean, p_max_late_ms bigint, p_keep_ms bigint,
    p_max_attempts integer
) RETURNS TABLE (o_kind text, o_attempt integer, o_slot bigint, o_now_ms bigint,
                 o_marked boolean)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM django_anarchon_joblock l
            WHERE l.job = p_job AND l.paused_at_ms IS NOT NULL
                AND (l.paused_until_ms IS NULL OR l.paused_until_ms
                    > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)) THEN
        RETURN QUERY SELECT 'paused'::text, NULL::integer, NULL::bigint,
            floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, false;
        RETURN;
    END IF;
    RETURN QUERY SELECT f.o_kind, f.o_attempt, f.o_slot, f.o_now_ms,
            f.o_kind IN ('late', 'overlap') AND EXISTS (
                SELECT 1 FROM django_anarchon_ledgermark m
                WHERE m.job = p_job AND m.slot = p_slot)
        FROM anarchon_run_claim_v2(p_job, p_slot, p_token, p_instance, p_lease_ms, p_reason,
            p_overlap_skip, p_max_late_ms, p_keep_ms, p_max_attempts) f;
END
$$;

CREATE OR REPLACE FUNCTION anarchon_run_claim_many_v3(
    p_jobs text[], p_slots bigint[], p_tokens text[], p_instances text[], p_lease_ms bigint[],
    p_reasons text[], p_overlap_skip boolean[], p_max_late_ms bigint[], p_keep_ms bigint[],
    p_max_attempts integer[]
) RETURNS TABLE (o_index integer, o_kind text, o_attempt integer, o_slot bigint,
                 o_now_ms bigint, o_marked boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_result record;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_jobs, 1), 0) LOOP
        SELECT * INTO v_result FROM anarchon_run_claim_v3(p_jobs[i], p_slots[i], p_tokens[i],
            p_instances[i], p_lease_ms[i], p_reasons[i], p_overlap_skip[i], p_max_late_ms[i],
            p_keep_ms[i], p_max_attempts[i]);
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


def create_claim_functions_v3(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CLAIM_FUNCTIONS_V3)


def drop_claim_functions_v3(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS anarchon_run_claim_many_v3(text[], bigint[], text[], "
            "text[], bigint[], text[], boolean[], bigint[], bigint[], integer[])"
        )
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS anarchon_run_claim_v3"
            "(text, bigint, text, text, bigint, text, boolean, bigint, bigint, integer)"
        )


class Migration(migrations.Migration):

    dependencies = [
        ('django_anarchon', '0007_ledger_pause_backfill'),
    ]

    operations = [
        migrations.RunPython(create_claim_functions_v3, drop_claim_functions_v3, elidable=False),
    ]

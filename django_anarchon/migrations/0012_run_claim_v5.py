# Written by hand: on PostgreSQL, a single runs.claim() of a new run takes its job's lock,
# then decides as anarchon_run_claim_v4 (docs/backends/database.md, docs/decisions.md).
#
# Additive only: one new function; the previous release never calls it and keeps sending a
# single claim as a batch of one through anarchon_run_claim_many_v6, and a release that
# finds it missing (migrations not applied yet) does the same.

from django.db import migrations

# anarchon_run_claim_v5: what anarchon_run_claim_many_v6 answers for a batch of one, without
# its arrays. v6 (0011) locks a batch's jobs before it writes a run, so that no claim waits
# in a circle with the lock path (which locks a job, then writes its run); the release sent
# a single claim through it as a batch of one. But v6 builds and plans its set-based
# statements for every call (EXECUTE), and the claimers of one slot queue on the job's
# lock, each doing that work under it: fifty claimers of one slot took 56 to 72 ms a round,
# twice the lock path's. v5 takes the job's lock (creating its row if it is missing) and
# then answers as v4 does, one claim, through plans cached per connection; v4's own lock
# of the job, for an overlap, is then held already. The server's now is read by v4, after
# the lock is held.
CLAIM_V5 = r"""
CREATE OR REPLACE FUNCTION anarchon_run_claim_v5(
    p_job text, p_slot bigint, p_token text, p_instance text, p_lease_ms bigint,
    p_reason text, p_overlap_skip boolean, p_max_late_ms bigint, p_keep_ms bigint,
    p_max_attempts integer, p_default_keep_ms bigint, p_min_keep_ms bigint
) RETURNS TABLE (o_kind text, o_attempt integer, o_slot bigint, o_now_ms bigint,
                 o_marked boolean)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM 1 FROM django_anarchon_joblock l WHERE l.job = p_job FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO django_anarchon_joblock (job, created_at)
            VALUES (p_job, clock_timestamp()) ON CONFLICT (job) DO NOTHING;
        PERFORM 1 FROM django_anarchon_joblock l WHERE l.job = p_job FOR UPDATE;
    END IF;
    RETURN QUERY SELECT * FROM anarchon_run_claim_v4(p_job, p_slot, p_token, p_instance,
        p_lease_ms, p_reason, p_overlap_skip, p_max_late_ms, p_keep_ms, p_max_attempts,
        p_default_keep_ms, p_min_keep_ms);
END
$$;
"""


def create_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CLAIM_V5)


def drop_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS anarchon_run_claim_v5(text, bigint, text, text, bigint, "
            "text, boolean, bigint, bigint, integer, bigint, bigint)"
        )


class Migration(migrations.Migration):

    dependencies = [
        ('django_anarchon', '0011_run_claim_many_v6'),
    ]

    operations = [
        migrations.RunPython(create_function, drop_function, elidable=False),
    ]

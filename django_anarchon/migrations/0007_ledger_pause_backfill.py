# The ledger (marks of skipped and missed slots), pauses, backfill requests (docs/ledger.md).
#
# Additive only: new tables the previous release never reads, and nullable columns on the
# job lock row, which the previous release inserts without; the reason "backfill" and the
# two permissions are new choices and options. On MariaDB/MySQL the job columns of the new
# tables get the binary NO PAD collation of migration 0003, so that (job, slot) is unique
# exactly as the runs are.

import importlib

from django.db import migrations, models

_collation = importlib.import_module(
    "django_anarchon.migrations.0003_job_names_binary_collation"
)


def binary_job_columns(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    name = _collation.exact_collation(connection)
    quote = schema_editor.quote_name
    for model_name in ("ledgermark", "backfillrequest"):
        model = apps.get_model("django_anarchon", model_name)
        field = model._meta.get_field("job")
        schema_editor.execute(
            f"ALTER TABLE {quote(model._meta.db_table)} MODIFY {quote(field.column)} "
            f"{field.db_type(connection)} CHARACTER SET utf8mb4 COLLATE {name} NOT NULL"
        )


class Migration(migrations.Migration):
    # MariaDB/MySQL cannot roll DDL back: the collation's ALTER runs outside a transaction.
    atomic = False

    dependencies = [
        ('django_anarchon', '0006_enqueued_task'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='scheduledjob',
            options={'default_permissions': ('view',), 'permissions': [('run_job', 'Can run a job now from the admin'), ('pause_job', 'Can pause and resume a job from the admin'), ('backfill_job', 'Can backfill a job from the admin')], 'verbose_name': 'job', 'verbose_name_plural': 'jobs'},
        ),
        migrations.AddField(
            model_name='joblock',
            name='known_since_ms',
            field=models.BigIntegerField(blank=True, help_text='Since when the store has known the job with this schedule.', null=True, verbose_name='known since'),
        ),
        migrations.AddField(
            model_name='joblock',
            name='pause_note',
            field=models.TextField(blank=True, null=True, verbose_name='pause note'),
        ),
        migrations.AddField(
            model_name='joblock',
            name='paused_at_ms',
            field=models.BigIntegerField(blank=True, help_text="Epoch milliseconds on the database server's clock; empty: not paused.", null=True, verbose_name='paused at'),
        ),
        migrations.AddField(
            model_name='joblock',
            name='paused_by',
            field=models.CharField(blank=True, max_length=150, null=True, verbose_name='paused by'),
        ),
        migrations.AddField(
            model_name='joblock',
            name='paused_until_ms',
            field=models.BigIntegerField(blank=True, help_text='The pause ends by itself then (empty: until resumed).', null=True, verbose_name='paused until'),
        ),
        migrations.AddField(
            model_name='joblock',
            name='schedule_fingerprint',
            field=models.CharField(blank=True, max_length=64, null=True, verbose_name='schedule fingerprint'),
        ),
        migrations.AlterField(
            model_name='run',
            name='reason',
            field=models.CharField(choices=[('scheduled', 'scheduled'), ('manual', 'manual'), ('catch-up', 'catch-up'), ('takeover', 'takeover'), ('backfill', 'backfill')], max_length=16, verbose_name='reason'),
        ),
        migrations.AlterField(
            model_name='runattempt',
            name='reason',
            field=models.CharField(choices=[('scheduled', 'scheduled'), ('manual', 'manual'), ('catch-up', 'catch-up'), ('takeover', 'takeover'), ('backfill', 'backfill')], max_length=16, verbose_name='reason'),
        ),
        migrations.CreateModel(
            name='BackfillRequest',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('scheduler', models.CharField(default='default', max_length=100, verbose_name='scheduler')),
                ('job', models.CharField(max_length=255, verbose_name='job')),
                ('start_ms', models.BigIntegerField(verbose_name='from')),
                ('end_ms', models.BigIntegerField(verbose_name='to')),
                ('slots', models.JSONField(default=list, verbose_name='slots')),
                ('overlap', models.CharField(default='skip', max_length=16, verbose_name='overlap')),
                ('requested_by', models.CharField(blank=True, max_length=150, verbose_name='requested by')),
                ('requested_at', models.DateTimeField(auto_now_add=True, verbose_name='requested at')),
                ('claimed_by', models.CharField(blank=True, max_length=255, verbose_name='claimed by instance')),
                ('claimed_at', models.DateTimeField(blank=True, null=True, verbose_name='claimed at')),
                ('finished_at', models.DateTimeField(blank=True, null=True, verbose_name='finished at')),
                ('done', models.PositiveIntegerField(default=0, verbose_name='slots done')),
            ],
            options={
                'verbose_name': 'backfill request',
                'verbose_name_plural': 'backfill requests',
                'ordering': ['-requested_at'],
                'indexes': [models.Index(fields=['scheduler', 'finished_at'], name='anarchon_backfill_open')],
            },
        ),
        migrations.CreateModel(
            name='LedgerMark',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('job', models.CharField(max_length=255, verbose_name='job')),
                ('slot', models.BigIntegerField(help_text='Scheduled instant, epoch milliseconds.', verbose_name='slot')),
                ('last_slot', models.BigIntegerField(verbose_name='last slot')),
                ('count', models.PositiveIntegerField(default=1, verbose_name='slots')),
                ('fate', models.CharField(choices=[('skipped', 'skipped'), ('missed', 'missed')], max_length=16, verbose_name='fate')),
                ('reason', models.CharField(max_length=16, verbose_name='reason')),
                ('at_ms', models.BigIntegerField(help_text="Epoch milliseconds on the database server's clock.", verbose_name='recorded at')),
                ('instance_id', models.CharField(max_length=255, verbose_name='instance')),
            ],
            options={
                'verbose_name': 'ledger mark',
                'verbose_name_plural': 'ledger marks',
                'constraints': [models.UniqueConstraint(fields=('job', 'slot'), name='anarchon_mark_job_slot')],
            },
        ),
        migrations.RunPython(binary_job_columns, migrations.RunPython.noop, elidable=False),
    ]

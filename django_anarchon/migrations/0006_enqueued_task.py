# Written by hand: the record of tasks that jobs with a task target enqueued (docs/tasks.md).
#
# Additive only: a new table the previous release never reads, so a rolling deploy keeps
# working on a migrated database. On MariaDB/MySQL the job column gets the binary NO PAD
# collation of migration 0003, so that (job, slot) is unique exactly as the runs are.

import importlib

from django.db import migrations, models

_collation = importlib.import_module(
    "django_anarchon.migrations.0003_job_names_binary_collation"
)


def binary_job_column(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    name = _collation.exact_collation(connection)
    model = apps.get_model("django_anarchon", "enqueuedtask")
    field = model._meta.get_field("job")
    quote = schema_editor.quote_name
    schema_editor.execute(
        f"ALTER TABLE {quote(model._meta.db_table)} MODIFY {quote(field.column)} "
        f"{field.db_type(connection)} CHARACTER SET utf8mb4 COLLATE {name} NOT NULL"
    )


class Migration(migrations.Migration):
    # MariaDB/MySQL cannot roll DDL back: the collation's ALTER runs outside a transaction.
    atomic = False

    dependencies = [
        ('django_anarchon', '0005_overlap_buffer_and_cancel'),
    ]

    operations = [
        migrations.CreateModel(
            name='EnqueuedTask',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('job', models.CharField(max_length=255, verbose_name='job')),
                ('slot', models.BigIntegerField(help_text='Scheduled instant, epoch milliseconds.', verbose_name='slot')),
                ('state', models.CharField(choices=[('enqueuing', 'enqueuing'), ('enqueued', 'enqueued')], max_length=16, verbose_name='state')),
                ('target', models.CharField(max_length=500, verbose_name='task')),
                ('task_id', models.CharField(blank=True, default='', max_length=255, verbose_name='task id')),
                ('attempt', models.PositiveIntegerField(verbose_name='attempt')),
                ('instance_id', models.CharField(max_length=255, verbose_name='instance')),
                ('enqueued_at', models.DateTimeField(blank=True, null=True, verbose_name='enqueued at')),
                ('error', models.TextField(blank=True, default='', verbose_name='error')),
            ],
            options={
                'verbose_name': 'enqueued task',
                'verbose_name_plural': 'enqueued tasks',
                'constraints': [models.UniqueConstraint(fields=('job', 'slot'), name='anarchon_enqueued_job_slot')],
            },
        ),
        migrations.RunPython(binary_job_column, migrations.RunPython.noop, elidable=False),
    ]

# Written by hand: overlap "buffer_one"/"buffer_all" and "cancel_other" (docs/options.md).
#
# Additive only, so the previous release keeps working on a migrated database during a
# rolling deploy: a new table of buffered slots it never reads, and a new value of
# Run.status, "cancelled" (a run a later slot's claim fenced). The previous release reads
# a cancelled run as finished and done: it neither retries it nor accepts a finish or
# heartbeat of its old token. The choices change needs no SQL.
#
# On MariaDB/MySQL the new job column gets the binary NO PAD collation of migration 0003.

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
    model = apps.get_model("django_anarchon", "bufferedslot")
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
        ('django_anarchon', '0004_admin_names'),
    ]

    operations = [
        migrations.AlterField(
            model_name='run',
            name='status',
            field=models.CharField(blank=True, choices=[('running', 'running'), ('success', 'success'), ('failed', 'failed'), ('interrupted', 'interrupted'), ('cancelled', 'cancelled')], max_length=16, null=True, verbose_name='last attempt status'),
        ),
        migrations.CreateModel(
            name='BufferedSlot',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('job', models.CharField(max_length=255, verbose_name='job')),
                ('slot', models.BigIntegerField(help_text='Scheduled instant, epoch milliseconds.', verbose_name='slot')),
                ('hold_until_ms', models.BigIntegerField(help_text="Epoch milliseconds on the database server's clock.", verbose_name='held until')),
            ],
            options={
                'verbose_name': 'buffered slot',
                'verbose_name_plural': 'buffered slots',
                'constraints': [models.UniqueConstraint(fields=('job', 'slot'), name='anarchon_buffered_job_slot')],
            },
        ),
        migrations.RunPython(binary_job_column, migrations.RunPython.noop, elidable=False),
    ]

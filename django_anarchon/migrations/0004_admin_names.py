# The admin's names of the attempt history: its counts read "44 run attempts" (the plural
# was "run history", so they read "44 run history"). Options only: no SQL.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_anarchon", "0003_job_names_binary_collation")]

    operations = [
        migrations.AlterModelOptions(
            name="runattempt",
            options={
                "ordering": ["-started_at", "-slot", "-attempt"],
                "verbose_name": "run attempt",
                "verbose_name_plural": "run attempts",
            },
        ),
    ]

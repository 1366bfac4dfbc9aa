# Written by hand: binary, NO PAD collations for the columns that name a job on
# MariaDB/MySQL (docs/backends/database.md, "Job names"). Other databases: nothing to do.
#
# A MariaDB/MySQL column takes the database's default collation, usually a case- and
# accent-insensitive PAD SPACE one (utf8mb4_general_ci, utf8mb4_unicode_ci,
# utf8mb4_0900_ai_ci...). Under it "Report" = "report", "e" = "é" (also the NFD form
# "e" + U+0301) and "a" = "a ": two jobs share one lock row and one run, so one of them
# never runs and its history shows the other's runs. A binary collation compares the
# exact UTF-8 bytes; it must also be NO PAD, or "a" and "a " still compare equal
# (utf8mb4_bin is PAD SPACE on both servers). MariaDB has utf8mb4_nopad_bin (10.2+),
# MySQL utf8mb4_0900_bin (8.0.17+); the one picked is the first the server has that really
# keeps "a" / "a " and "a" / "A" apart.
#
# Besides the job names, the columns compared with exact values next to them: the run's
# token (heartbeat, finish, release), the attempt's instance (in its unique key) and the
# run request's scheduler alias. MODIFY keeps every index and unique constraint of a column.
#
# The model state does not change (Django has no per-vendor collation), so a later
# AlterField of one of these fields on MariaDB/MySQL would reset its collation: such a
# migration must run COLLATE_COLUMNS again. Reversing restores the table's default
# collation; it fails if the table holds names that only the binary collation tells apart.

from django.db import migrations
from django.db.utils import NotSupportedError

#: model -> the fields whose column gets the binary collation.
COLLATE_COLUMNS = {
    "joblock": ("job",),
    "run": ("job", "token"),
    "runattempt": ("job", "instance_id"),
    "runrequest": ("scheduler", "job"),
}
CANDIDATE_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")


def exact_collation(connection):
    """The server's utf8mb4 collation that tells "a" from "a " and from "A"."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COLLATION_NAME FROM information_schema.COLLATIONS "
            "WHERE CHARACTER_SET_NAME = 'utf8mb4' AND COLLATION_NAME IN (%s, %s)",
            list(CANDIDATE_COLLATIONS),
        )
        present = {row[0] for row in cursor.fetchall()}
        for name in CANDIDATE_COLLATIONS:
            if name not in present:
                continue
            cursor.execute(
                f"SELECT _utf8mb4'a' = _utf8mb4'a ' COLLATE {name}, "
                f"_utf8mb4'a' = _utf8mb4'A' COLLATE {name}"
            )
            if tuple(cursor.fetchone()) == (0, 0):
                return name
    raise NotSupportedError(
        "django_anarchon needs a binary NO PAD utf8mb4 collation to keep job names apart "
        f"({' or '.join(CANDIDATE_COLLATIONS)}: MariaDB 10.2+, MySQL 8.0.17+); this server "
        "has neither"
    )


def _modify(apps, schema_editor, collation):
    connection = schema_editor.connection
    quote = schema_editor.quote_name
    for model_name, fields in COLLATE_COLUMNS.items():
        model = apps.get_model("django_anarchon", model_name)
        clauses = []
        for field_name in fields:
            field = model._meta.get_field(field_name)
            definition = field.db_type(connection)
            if collation is not None:
                definition += f" CHARACTER SET utf8mb4 COLLATE {collation}"
            definition += " NULL" if field.null else " NOT NULL"
            clauses.append(f"MODIFY {quote(field.column)} {definition}")
        schema_editor.execute(f"ALTER TABLE {quote(model._meta.db_table)} {', '.join(clauses)}")


def binary_job_columns(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        _modify(apps, schema_editor, exact_collation(schema_editor.connection))


def default_job_columns(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        _modify(apps, schema_editor, None)


class Migration(migrations.Migration):

    # MariaDB/MySQL cannot roll DDL back: Django refuses it inside a transaction.
    atomic = False

    dependencies = [
        ('django_anarchon', '0002_run_max_attempts_claim_v2'),
    ]

    operations = [
        migrations.RunPython(binary_job_columns, default_job_columns, elidable=False),
    ]

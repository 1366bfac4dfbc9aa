# The admin's Jobs page proxy and the run_job permission (django_anarchon.admin).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('django_anarchon', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='ScheduledJob',
            fields=[
            ],
            options={
                'verbose_name': 'job',
                'verbose_name_plural': 'jobs',
                'permissions': [('run_job', 'Can run a job now from the admin')],
                'proxy': True,
                'default_permissions': ('view',),
                'indexes': [],
                'constraints': [],
            },
            bases=('django_anarchon.runrequest',),
        ),
    ]

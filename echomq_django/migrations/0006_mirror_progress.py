from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("echomq_django", "0005_commit_outbox_names"),
    ]

    operations = [
        migrations.AddField(
            model_name="mirroredjob",
            name="progress",
            field=models.TextField(
                blank=True,
                help_text="the last progress its handler reported (JSON, at most 1,024 bytes)",
            ),
        ),
    ]

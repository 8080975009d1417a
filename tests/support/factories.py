"""factory-boy users for the admin tests.

``UserFactory`` makes an active user who is not staff; ``StaffUserFactory``
a staff user holding the view permissions of the mirror models, plus any
extra ``echomq_django`` codenames passed as ``permissions=[...]``
(``"retry_job"`` for retry by id).
"""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

VIEW_CODENAMES = ("view_mirroredjob", "view_mirroredqueue")


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    # Unusable (and cheap: no hashing); the tests log in with force_login.
    password = factory.django.Password(None)


class StaffUserFactory(UserFactory):
    is_staff = True

    @factory.post_generation
    def permissions(self, create, extracted, **kwargs):
        if not create:
            return
        codenames = [*VIEW_CODENAMES, *(extracted or [])]
        self.user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label="echomq_django", codename__in=codenames
            )
        )


def login_staff(client, *codenames):
    """A ``StaffUserFactory`` user with ``codenames``, logged in on ``client``."""
    user = StaffUserFactory(permissions=list(codenames))
    client.force_login(user)
    return user

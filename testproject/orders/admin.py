"""Orders in the admin, read-only: the rows are written by the API and the
pipeline's handlers, never by hand."""

from django.contrib import admin

from .models import Order, OrderLine


class OrderLineInline(admin.TabularInline):
    model = OrderLine
    fields = ("number", "sku", "qty", "optional")
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "customer", "status", "via", "created", "updated")
    list_filter = ("status", "via")
    search_fields = ("customer", "email")
    readonly_fields = (
        "customer",
        "email",
        "card",
        "status",
        "via",
        "outcome",
        "created",
        "updated",
    )
    inlines = (OrderLineInline,)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

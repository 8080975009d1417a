"""The orders pipeline: echomq_django used the way a real project would (the README's demo).

``POST /orders/`` saves an order and, on commit, adds its flow::

    orders/order-<pk>            orders.fulfil     (the parent: writes the outcome)
    ├── validation/validate-<pk> orders.validate   (a parent itself)
    │   └── inventory/reserve-<pk>-<n>  inventory.reserve, one per line
    │                                   (optional lines: ignore_dependency_on_failure)
    └── payments/charge-<pk>     orders.charge

``rules.py`` says how each step behaves, deterministically from the order's
data, and ``predict(order)`` the end state; ``manage.py orders_demo`` (run by
``scripts/demo.sh``) posts orders and checks every flow against it.
"""

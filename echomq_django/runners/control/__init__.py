"""A running worker's half of what is changed while it runs (docs/explanation/house.md,
"runners/"): its size by the autoscaler, and the operators' commands."""

"""The admin's words: state badges, policies, durations, folded errors and
booleans that read the right way. Pure template filters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.template import Context, Template

from echomq_django.templatetags.echomq_admin import (
    emq_between,
    emq_breakable,
    emq_flag,
    emq_has_more,
    emq_headline,
    emq_policy,
    emq_seconds,
    emq_state,
)


def test_states_are_badges_with_their_words():
    assert emq_state("dead") == '<span class="emq-badge emq-state-dead">dead</span>'
    assert emq_state("awaiting_children") == (
        '<span class="emq-badge emq-state-awaiting_children">awaiting children</span>'
    )
    assert emq_state("") == "-"
    assert emq_state("<b>") == '<span class="emq-badge emq-state-&lt;b&gt;">&lt;b&gt;</span>'


def test_policies_read_as_what_happens_to_the_parent():
    assert emq_policy("fp") == (
        '<span class="emq-policy" title="fail_parent_on_failure: if this child dies, its parent '
        'dies too">on failure: fail the parent</span>'
    )
    assert "on failure: ignore (the parent goes on)" in emq_policy("id")
    assert "on failure: remove (the parent goes on)" in emq_policy("rd")
    assert emq_policy(None) == "-"


def test_durations_and_spans():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    assert emq_seconds(None) == "-"
    assert emq_seconds(75) == "1 min 15 s"
    assert emq_between(t0, t0 + timedelta(milliseconds=1500)) == "1.5 s"
    assert emq_between(t0, None) == "-"
    assert emq_between(t0 + timedelta(seconds=1), t0) == "-"


def test_errors_fold_under_their_first_line():
    error = "ValueError: bad\nTraceback (most recent call last):\n  ...\nValueError: bad"
    assert emq_headline(error) == "ValueError: bad"
    assert emq_has_more(error) is True
    assert emq_has_more("CardDeclined: no") is False
    assert emq_headline("failed by child emq:{shop}:job:charge: CardDeclined: no") == (
        "failed by child shop/charge: CardDeclined: no"
    )
    html = Template('{% include "admin/echomq_django/includes/error.html" with error=e %}').render(
        Context({"e": error})
    )
    assert '<summary><span class="emq-error-head">ValueError: bad</span>' in html
    assert '<pre class="emq-error">ValueError: bad\nTraceback' in html


def test_booleans_read_the_right_way_round():
    assert emq_flag(True, "gone,in Redis") == '<span class="emq-flag-yes">gone</span>'
    assert emq_flag(False, "gone,in Redis") == '<span class="emq-flag-no">in Redis</span>'
    assert emq_flag(False) == '<span class="emq-flag-no">no</span>'


def test_long_names_break_at_their_joints_and_stay_escaped():
    assert emq_breakable("invoice-2026-11-000123-retry") == (
        "invoice-<wbr>2026-<wbr>11-<wbr>000123-<wbr>retry"
    )
    assert emq_breakable("billing.tasks.render_pdf") == "billing.<wbr>tasks.<wbr>render_<wbr>pdf"
    assert emq_breakable("<b>-x") == "&lt;b&gt;-<wbr>x"
    assert emq_breakable(None) == ""

"""The two reference pages as Markdown: docs/knobs.md (every knob) and docs/export.md (every
export target), from the declarations and the facts found by running them (facts.py)."""

from __future__ import annotations

import json
import sys
from typing import Any

from autofit.export import TARGETS
from autofit.export.base import Refused, Target
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, Knob, Say
from autofit.reference.facts import (
    RULE_GPUS,
    STUDY,
    Facts,
    changed_from_defaults,
    merged,
    shown_values,
)
from autofit.units import value as text

COMMAND = "python -m autofit.reference"
HOOKS = ("prepare", "build_context", "apply", "forward_context", "after_training")


def _cell(words: str) -> str:
    """Text for a Markdown table cell."""
    return words.replace("|", "\\|").replace("\n", " ")


def _shown(value: Any, knob: Knob) -> str:
    return f"`{text(value)}`" if value is not None else knob.default_means


def _families(names: list[str], every: list[str]) -> str:
    return "" if sorted(names) == sorted(every) else f" ({', '.join(sorted(names))})"


def _docstring(obj: Any) -> list[str]:
    """The text of the module that declares `obj`."""
    doc = (sys.modules[type(obj).__module__].__doc__ or "").strip()
    return [*doc.splitlines(), ""] if doc else []


def _said(words: Say) -> str:
    def setting(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    parts = [f"`{key}={setting(value)}`" for key, value in words.settings.items()]
    if words.note:
        parts.append(f"note: {words.note}")
    if words.warning:
        parts.append(f"warning: {words.warning}")
    if words.files:
        parts.append("writes " + ", ".join(f"`{name}`" for name in words.files))
    return "; ".join(parts)


def _refused(refusal: Refused) -> str:
    return f"refused: {refusal.why}; offers {refusal.offers}"


# -- docs/knobs.md -------------------------------------------------------------------------------


def words(facts: Facts, target: Target, knob: Knob, value: Any, family: str) -> str | None:
    """What `target` writes for `knob=value` in a run of `family`, as a phrase; None where no
    valid run of the family has the value."""
    verdict = facts.verdict(target, knob.name, value, family)
    if verdict is None:
        return None
    if verdict.refused is not None:
        refusal = verdict.refused
        if refusal.knob == knob.name:
            return _refused(refusal)
        return (
            f"refused in every run tried: {target.name} refuses "
            f"{refusal.knob}={text(refusal.value)} there"
        )
    plan = verdict.plan
    assert plan is not None
    if not knob.applies(verdict.config, plan.point.preset):
        return "does not apply to this family's runs"
    value = verdict.config[knob.name]
    if knob.name in plan.written_by_layout:
        phrase = f"written by the target's layout (`{text(value)}`)"
    else:
        said = knob.express(target.vocabulary, value, plan.subject, target.own_code)
        assert isinstance(said, Say), f"{target.name} exported {knob.name}, which it refuses"
        phrase = _said(said) or (
            "nothing: the default asks nothing"
            if value == knob.default
            else "nothing in the target's own words"
        )
    run = changed_from_defaults(verdict.config, knob.name)
    phrase += f" (in a run with {run})" if run else ""
    before = verdict.before
    if before is None or before.refused is None:
        return phrase
    run = changed_from_defaults(before.config, knob.name)
    where = f"in a run with {run}" if run else "with the other knobs at their defaults"
    return f"{phrase}; {where}, {_refused(before.refused)}"


def _trainer_words(facts: Facts, knob: Knob) -> list[str]:
    lines: list[str] = []
    for target in TARGETS.values():
        families = [f for f in facts.presets if target.trains(f)]
        rows: list[str] = []
        for value in shown_values(knob):
            by_phrase: dict[str, list[str]] = {}
            for family in families:
                phrase = words(facts, target, knob, value, family)
                if phrase is not None:
                    by_phrase.setdefault(phrase, []).append(family)
            for phrase, named in by_phrase.items():
                which = _families(named, families) if len(by_phrase) > 1 else ""
                rows.append(f"  - {_shown(value, knob)}{which}: {phrase}")
        if rows:
            lines += [f"- **{target.name}**", *rows]
    return lines


def _hooks(knob: Knob) -> str:
    own = [h for h in HOOKS if getattr(type(knob), h) is not getattr(Knob, h)]
    parts = [f"hooks {', '.join(f'`{h}`' for h in own)}" if own else "no hooks"]
    parts.append(f"reach `{knob.reach}`")
    if knob.writes:
        parts.append("writes " + ", ".join(f"`run.{f}`" for f in knob.writes))
    if knob.reads:
        parts.append("reads " + ", ".join(f"`run.{f}`" for f in knob.reads))
    if knob.after:
        parts.append("after " + ", ".join(f"`{k}`" for k in knob.after))
    return "; ".join(parts)


def _left_out(knob: Knob) -> list[str]:
    """Why a search leaves a value out when it also tries the knob's other values."""
    searched = tuple(knob.sample_values())
    found: list[str] = []
    for value in searched:
        reasons = [knob.needless_without_trainer(value, searched)]
        reasons += [knob.needless_on(value, searched, load_gpu(g)) for g in RULE_GPUS]
        found += [r for r in reasons if r and r not in found]
    return found


def _knob(facts: Facts, knob: Knob, first_of_module: str) -> list[str]:
    lines = ["", f"## {knob.name}", ""]
    module = type(knob).__module__
    if first_of_module == knob.name:
        lines += _docstring(knob)
    else:
        lines += [f"{knob.help[0].upper()}{knob.help[1:]}.", ""]
        lines += [
            f"Declared beside [`{first_of_module}`](#{first_of_module}), whose text covers it.",
            "",
        ]
    lines += [f"Declared in `{module.replace('.', '/')}.py`; {_hooks(knob)}.", ""]
    if knob.depends_on:
        named = ", ".join(f"[`{k}`](#{k})" for k in knob.depends_on)
        lines += [f"Its rules, words and hooks read the values of {named}.", ""]
    if knob.values is not None:
        lines += ["| value | what it asks of one's own training code |", "| --- | --- |"]
        lines += [f"| `{text(v)}` | {_cell(means)} |" for v, means in knob.values.items()]
    else:
        lines.append(f"Values: {knob.describe()}.")
    lines += ["", f"Default: {_shown(knob.default, knob)}.", ""]
    rules = merged(facts.rules()[knob.name])
    if rules:
        lines += ["Rules (a run breaking one is `invalid`, with this reason):", ""]
        every = list(facts.presets)
        lines += [f"- {why}{_families(f, every)}" for why, f in sorted(rules.items())]
        lines.append("")
    left_out = _left_out(knob)
    if left_out:
        lines += ["A search leaves out:", "", *[f"- {why}" for why in left_out], ""]
    lines += ["Trainer words (what each export target writes for each value):", ""]
    return lines + _trainer_words(facts, knob)


def knobs_page(facts: Facts) -> str:
    presets = ", ".join(f"{family}: `{p.name}`" for family, p in facts.presets.items())
    lines = [
        "# Knobs",
        "",
        f"<!-- Generated by `{COMMAND}` from autofit/knobs/; edit the knobs, not this page. -->",
        "",
        "Every setting autofit searches and probes, as its module in `autofit/knobs/` declares it",
        "(how to add one: [contributing](contributing.md#adding-a-knob-or-a-value)). Each is a",
        "Hydra override (`autofit probe knob=value`), a key of a search space and a column of a",
        "study's tables. For each knob: what it is, its values and default, the rules that make a",
        "value invalid beside the others (decided before any probe), how it is applied to a run,",
        "and what each export target writes for each value.",
        "",
        "The rules and words were found by running the declarations: each value with every other",
        "knob at its default or one of them changed (for the words, the first change that makes",
        "the run valid and the knob matter, and where the export refuses another knob, that knob",
        f"changed too), on one preset of each model family ({presets}), on an A40. A rule",
        "that names a model says `<model>`, the figure of an open knob `N`; families are named",
        "where a rule or the words hold for some only.",
        "",
        "| knob | values | default |",
        "| --- | --- | --- |",
    ]
    first: dict[str, str] = {}
    for name, knob in REGISTRY.items():
        first.setdefault(type(knob).__module__, name)
        lines.append(
            f"| [`{name}`](#{name}) | {_cell(knob.describe())} | {_shown(knob.default, knob)} |"
        )
    for knob in REGISTRY.values():
        lines += _knob(facts, knob, first[type(knob).__module__])
    return "\n".join(lines) + "\n"


# -- docs/export.md ------------------------------------------------------------------------------


def _written(facts: Facts, target: Target) -> list[str]:
    """Each family's files and launch command, in the first run the target exports; families
    alike, together."""
    found: dict[tuple[str, str, str], list[str]] = {}
    for family in facts.presets:
        if not target.trains(family):
            continue
        verdict = facts.verdict(target, "batch_size", 1, family)
        if verdict is None or verdict.plan is None:
            why = verdict.refused.short if verdict and verdict.refused else "no valid run"
            found.setdefault((f"refuses every run tried: {why}", "", ""), []).append(family)
            continue
        plan = verdict.plan
        files = ", ".join(f"`{n}` ({plan.descriptions[n]})" for n in plan.files)
        found.setdefault((files, plan.command, changed_from_defaults(verdict.config)), []).append(
            family
        )
    lines: list[str] = []
    for (files, command, run), families in found.items():
        named = ", ".join(f"{f} (`{facts.presets[f].name}`)" for f in families)
        lines += [f"- {named}{f', with {run}' if run else ''}: {files}", ""]
        if command:
            lines += ["  ```", f"  {command}", "  ```", ""]
    return lines


def _refusals(facts: Facts, target: Target) -> dict[tuple[str, str, str, str], list[str]]:
    """Every value of a knob the target refuses in some run, with why, what it offers instead
    and the families."""
    found: dict[tuple[str, str, str, str], list[str]] = {}
    for name, knob in REGISTRY.items():
        for value in shown_values(knob):
            for family in facts.presets:
                if not target.trains(family):
                    continue
                verdict = facts.verdict(target, name, value, family)
                if verdict is not None and verdict.refused is None:
                    verdict = verdict.before
                if verdict is None or verdict.refused is None or verdict.refused.knob != name:
                    continue
                refusal = verdict.refused
                key = (name, text(refusal.value), refusal.why, refusal.offers)
                found.setdefault(key, []).append(family)
    return found


def _target(facts: Facts, target: Target) -> list[str]:
    lines = ["", f"## {target.name}", "", *_docstring(target)]
    every = [f for f in facts.presets if target.trains(f)]
    if target.families is not None:
        lines += ["| family | its trainer |", "| --- | --- |"]
        lines += [f"| {f} | `{script}` |" for f, script in target.families.items()]
        others = [f for f in facts.presets if f not in every]
        if others:
            lines += ["", f"Refuses every model of the families {', '.join(others)}."]
        lines.append("")
    lines += ["What it writes, every knob at its default unless named:", ""]
    lines += _written(facts, target)
    lines += ["What it refuses:", ""]
    refusals = _refusals(facts, target)
    if not refusals:
        return [*lines, "Nothing: every value of every knob is expressed."]
    lines += ["| knob=value | why | it offers |", "| --- | --- | --- |"]
    for (knob, value, why, offers), families in refusals.items():
        which = _families(families, every)
        lines.append(f"| `{knob}={value}`{which} | {_cell(why)} | {_cell(offers)} |")
    return lines


def export_page(facts: Facts) -> str:
    presets = ", ".join(f"`{p.name}`" for p in facts.presets.values())
    lines = [
        "# Export targets",
        "",
        f"<!-- Generated by `{COMMAND}` from autofit/export/ and autofit/knobs/; edit those,"
        " not this page. -->",
        "",
        "What `autofit export target=NAME` writes for each trainer, the command it prints, and",
        "every value of a knob it refuses (the export stops with one line naming the target, the",
        "knob, the value and what the trainer offers instead). How to use them:",
        "[export guide](export-guide.md); what each knob's value becomes in each target's files:",
        "[knobs](knobs.md).",
        "",
        f"The files and commands below are those of one preset per model family ({presets}),",
        f"exported from an A40 study called `{STUDY}`. A value is refused where the target",
        "refused it in some valid run; the values of an open knob are shown as one past its",
        "default.",
        "",
        "| target | what it is | trains |",
        "| --- | --- | --- |",
    ]
    for name, target in TARGETS.items():
        trains = ", ".join(target.families) if target.families is not None else "any family"
        lines.append(f"| [`{name}`](#{name}) | {_cell(target.summary)} | {_cell(trains)} |")
    for target in TARGETS.values():
        lines += _target(facts, target)
    return "\n".join(lines) + "\n"

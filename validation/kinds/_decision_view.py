"""The report part of a decision that the deciding kinds (sweep, ab) share: the sentence block of a recorded decision,
the point a plot marks, whether a decision compared anything, and a run's status cell; and the rule both follow for a
decision over one run a side with no run-to-run noise (without_run_noise), whose words the sentences use. Not a
kind: kinds import it, as they import _plot_helpers. Each report part reads the step's typed record
(validation.results.run.Step: a kind's Result)."""

from __future__ import annotations

import dataclasses

from validation.analysis.significance import Comparison, Decision
from validation.formatting import finite, fmt_num, fmt_pct, params_text, status_view
from validation.kinds.blocks import Badge, Block, Paragraph
from validation.results.codec import given
from validation.results.decision import Choice, ComparisonRecord, DecisionRecord
from validation.results.run import Step as StepRecord


def decision_mark(step: StepRecord) -> tuple[str, str] | None:
    """(run label, word) of the point a sweep's or an A/B's plot marks: the decision its text states, "winner" for
    a significant choice, "kept" for the point kept without a significant difference; None without a choice."""
    choice = given(step.choice) or given(step.winner)
    if not choice or choice.label is None:
        return None
    significant = bool(choice.significant if choice.significant is not None else not given(step.decision))
    return choice.label, "winner" if significant else "kept"


def compared_nothing(step: StepRecord) -> bool:
    """Whether a step's decision compared nothing (every alternative but one left out): its summary line then says
    "no decision, nothing compared", never "no significant difference"."""
    return nothing_compared(step.decision)


def nothing_compared(decision: DecisionRecord | None) -> bool:
    """Whether a recorded decision compared nothing (fewer than two alternatives measured, e.g. every run
    disturbed): the point it keeps is kept without evidence, so its sentences say "no decision, nothing compared",
    never "no significant difference", and its step's `decided` is false."""
    return decision is not None and not decision.comparisons


def unkept_difference(decision: DecisionRecord | None) -> str | None:
    """The significant difference a recorded decision found but chose nothing on, in words ("batched +821.0% against
    baseline"), else None: its comparison is significant while its choice is not (an A/B's winner whose throughput
    was not stable, a difference not the same way in every interleaved block of repeats, or not beyond what the run
    orders give). Its headline and summary line then say so, never "no significant difference"."""
    comp = given(decision.comparison) if decision is not None else None
    if comp is None or comp.significant is not True or finite(comp.rel) is None:
        return None
    return f"{fmt_num(comp.variant)} {fmt_pct(comp.rel, signed=True)} against {fmt_num(comp.baseline)}"


def block_means_alone(comp: ComparisonRecord | Comparison | None) -> bool:
    """Whether a comparison (significance.Comparison, or its record) rests on block means of one run each with no
    run-to-run noise held to (neither measured nor declared: its run_to_run is null): its significance is that of
    block means alone, which never see how far the next launch's level lies (without_run_noise), so it decides
    nothing."""
    return bool(comp is not None and comp.method == "blocks" and finite(comp.run_to_run) is None)


# why a comparison on block means alone is not "same" either, after no_run_noise's sentence
NOT_SAME = ", nor an interval inside the noise floor show the two the same"


def held_to_no_run_noise(comp):
    """A comparison on block means alone (block_means_alone; a significance.Comparison, its record, or an Effect of
    one) as its step shows it: neither significant nor "same", "inconclusive" whatever its interval. Block means of
    one window see only the noise within it: a difference they find may be the launches' levels, and an interval
    of theirs inside the noise floor leaves out how far the next launch's level lies, so it cannot show the two
    the same (no_run_noise, NOT_SAME)."""
    return dataclasses.replace(comp, significant=False, verdict="inconclusive")


def on_block_means_alone(decision: DecisionRecord | None) -> bool:
    """Whether a recorded decision's comparison rests on block means alone (block_means_alone)."""
    return block_means_alone(given(decision.comparison) if decision is not None else None)


def unkept_clause(decision: DecisionRecord | None) -> str | None:
    """What a recorded decision found but chose nothing on, as a clause ("batched +821.0% against baseline is
    significant but decides nothing"; on block means of one run each with no run-to-run noise: "... is ahead on block
    means alone, which decides nothing"), else None (unkept_difference)."""
    found = unkept_difference(decision)
    if found is None:
        return None
    if on_block_means_alone(decision):
        return f"{found} is ahead on block means alone, which decides nothing"
    return f"{found} is significant but decides nothing"


def no_single_winner(decision: DecisionRecord | None, choice: Choice | None) -> bool:
    """Whether a significant choice is not a winner: the default beaten by a group of points the data cannot order
    (the best's mean chose among them), so its sentences never call it the winner or the best."""
    return bool(choice is not None and choice.significant and decision is not None
                and decision.comparisons is not None and decision.winner is None)


def kept_text(step: StepRecord, name: str) -> str:
    """What a step's summary line says of a point or variant `name` kept without a significant choice: "no
    decision, nothing compared", a significant difference it did not choose on (unkept_difference), or "no
    significant difference"."""
    if compared_nothing(step):
        return f"no decision, nothing compared: {name} kept"
    found = unkept_clause(step.decision)
    if found:
        return f"{name} kept, no winner: {found} (see the decision)"
    return f"no significant difference: {name} kept"


def status_badge(status: str | None, reason: str | None, mark: str | None = None) -> Badge:
    """A run's status cell: its status word, or `mark` in bold (the chosen point's row), with its reason after it."""
    view = status_view(status)
    return Badge(mark or view["word"], view["css"], bold=mark is not None, after=str(reason) if reason else None)


def decision_blocks(decision: DecisionRecord, choice: Choice | None) -> list[Block]:
    """A recorded decision (sweep or ab): a headline, the reason, the recommendation and the figures. A decision that
    compared nothing says so in its headline (never "no significant difference"). The figures
    (the noise floor, runs per variant, repeats needed) are left out when the decision compared nothing (e.g. an A/B
    whose only variant the trainer ignored), so that the section never prints "0 run(s) per variant" under a
    comparison table."""
    comp = given(decision.comparison)
    ignored = [str(x) for x in decision.excluded_ignored or []]
    name = (params_text(choice.params) if choice and choice.params else str(choice.label) if choice else None)
    reason = fmt_num(decision.reason)
    if choice and choice.significant and no_single_winner(decision, choice):
        headline = (f"{name} (significant against the default"
                    + (f" {fmt_num(decision.default)}" if decision.default is not None else "")
                    + "; no single winner)")
    elif choice and choice.significant:
        headline = f"{name} (significant)"
    elif choice and ignored and not comp:
        # nothing was compared for the decision: the only variants were settings the trainer ignored
        headline = f"{name} kept: {', '.join(ignored)} not considered (the trainer ignored its settings here)"
        reason = (f"The trainer ignored the settings of {', '.join(ignored)} on this machine, so the table above "
                  "compares equal settings (an A/A check of the measurement) and no setting is recommended from "
                  "this step.")
    elif choice and nothing_compared(decision):
        headline = f"no decision, nothing compared: {name} kept"
    elif choice and unkept_difference(decision):
        headline = f"{name} kept, no winner: {unkept_clause(decision)} (the reason below)"
    elif choice:
        headline = f"no significant difference: {name} kept"
    else:
        headline = "no decision"
    out: list[Block] = [Paragraph(f"**Decision**: {headline}"), Paragraph(reason)]
    # a decision recorded since recommendations need replicated effects says why it is (not) recommended
    if decision.recommendation:
        out.append(Paragraph(f"**Recommendation**: {fmt_num(decision.recommendation)}"))
    seed = decision.order_seed
    order = f"random within each repeat (seed {seed})" if seed is not None else None
    if comp or decision.method is not None:  # measured
        repeats = decision.repeats
        out.append(Paragraph(f"Noise floor {fmt_pct(decision.noise_floor)} · {fmt_num(repeats)} "
                             f"{'run' if repeats == 1 else 'runs'} per variant · repeats needed to detect a 5% "
                             f"difference: {fmt_num(decision.recommended_repeats)}"
                             + (f" · run order {order}" if order else ""), style="muted"))
    elif order:
        out.append(Paragraph(f"Run order {order}", style="muted"))
    return out


# what a decision over one run a side needs to name a winner
RUN_NOISE_FIX = ("to decide, set `repeats: 2` or more (interleaved repeats measure how far one launch lies from the "
                 "next) or declare the machine's launch noise (`compare: {launch_sd, pairs}`, from A/A pairs)")


def no_run_noise(unit: str = "point") -> str:
    """Why one run a `unit` (a sweep's point, an A/B's variant) with no run-to-run noise decides nothing."""
    return (f"with one run a {unit} and no run-to-run noise measured or declared, block means of each run's window "
            f"do not see how far the next launch's level lies, so no {unit} can be significant")


NO_RUN_NOISE = no_run_noise("point")


def without_run_noise(d: Decision, keep: str, unit: str = "point") -> Decision:
    """A decision over one run a `unit` (a sweep's point, an A/B's variant) with neither a measured nor a declared
    run-to-run noise: block means of one window see only the noise within it, and launches of one setting differ by
    several percent (three points of equal throughput whose launch levels differ by 3% gave a significant winner in
    most simulated sweeps; two equal A/B variants, in three A/Bs of four), so nothing is significant: `keep` is kept,
    the reason says why and names the fix. A decision that was not significant keeps its choice and says the same."""
    why = no_run_noise(unit)
    if not d.significant:
        return dataclasses.replace(d, reason=f"{d.reason.rstrip('.')}; {why}: {RUN_NOISE_FIX}.")
    comp = d.comparison
    found = (f"{comp.variant} is ahead of {comp.baseline} on block means alone ({comp.metric} {comp.describe()})"
             if comp is not None else f"{d.choice} is ahead on block means alone")
    text = f"no winner: {found}, but {why}; {keep} is kept"
    left_out = "".join(f"; excluded: {k} ({reason})" for k, reason in d.excluded) + "".join(
        f"; left out because other work used the machine while it ran: {k} (repeat {r + 1})"
        for k, r in d.disturbed_runs)
    return dataclasses.replace(d, winner=None, choice=keep, significant=False, kept_default=True,
                               reason=f"{text}{left_out}; {RUN_NOISE_FIX}.", recommendable=False,
                               recommendation=f"nothing is recommended: {text}")

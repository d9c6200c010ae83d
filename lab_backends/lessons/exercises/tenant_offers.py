"""What a learner's tenant strategy (notebook 09b) answered for each request offered to a batch, read from the
call log, and the fault those answers show.

The checker (:mod:`lab_backends.lessons.exercises.batch_strategy`) loads the learner's file wrapped in
``c_backends/batching/call_log``, which logs every ``ModelBatchIncludeRequest`` with the request's id and the
answer; this module turns those lines into :class:`Offer` records and judges them. Kept apart from the checker:
this is the evidence and its reading, pure functions tested without a server (tests/test_batch_strategy.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lab_backends.lessons import strategy_calls

#: Bursts the checker sends at most before it says it could not judge (the message quotes it).
LOGGED_TRIES = 4


@dataclass(frozen=True)
class Offer:
    """One ``ModelBatchIncludeRequest`` call on a batch that already held a request, read from the call log.

    ``batch`` is the tenant of the batch's first request ("" for none), ``tenant`` the offered one's.
    """

    request_id: str
    batch: str
    tenant: str
    included: bool

    @property
    def same(self) -> bool:
        return self.batch == self.tenant


#: The call log's lines (Triton quotes a log message: the closing quote is not part of the last field).
_INIT = re.compile(r"BatchInitialize batcher=\S+ -> tally=([^\s\"]+)")
_INCLUDE = re.compile(r"BatchIncludeRequest tally=(\S+) -> ([01]) request=([^\s\"]*)")
_FINAL = re.compile(r"BatchFinalize tally=([^\s\"]+)")


def offers_in(log_text: str, tenant_of: dict[str, str]) -> tuple[list[Offer], list[str]]:
    """The offers to non-empty batches in the call log (c_backends/batching/call_log), and the requests
    refused as the first of a batch.

    A batch is a tally, from the ``BatchInitialize`` that returned it to its ``BatchFinalize``; its first
    included request gives its tenant. Requests of other runs (ids not in ``tenant_of``) are skipped.
    """
    first: dict[str, str | None] = {}
    offers: list[Offer] = []
    refused_first: list[str] = []
    for line in log_text.splitlines():
        if strategy_calls.TAG not in line:
            continue
        if m := _INIT.search(line):
            first[m.group(1)] = None
        elif m := _FINAL.search(line):
            first.pop(m.group(1), None)
        elif m := _INCLUDE.search(line):
            tally, included, rid = m.group(1), m.group(2) == "1", m.group(3)
            if rid not in tenant_of:
                continue
            batch = first.get(tally)
            if batch is None:
                if included:
                    first[tally] = tenant_of[rid]
                else:
                    refused_first.append(rid)
            else:
                offers.append(Offer(rid, batch, tenant_of[rid], included))
    return offers, refused_first


def judge(offers: list[Offer], mixed: str = "") -> str:
    """The fault the strategy's own decisions show (``""``: none), most telling first.

    ``mixed``: a mixed batch seen in the trace, described. Each message says what was seen and then the
    rule; a cause is named only where the decisions single it out (e.g. a prefix comparison: only
    tenants that begin with the batch's were let in, and others were refused).
    """
    same = [o for o in offers if o.same]
    other = [o for o in offers if not o.same]
    let_in = [o for o in other if o.included]
    kept_out = [o for o in same if not o.included]
    if let_in and kept_out and not any(o.included for o in same) and all(o.included for o in other):
        return (f"IncludeRequest answered the wrong way round: it took all {len(other)} requests of other tenants "
                f"offered to a batch (e.g. {_shown(let_in[0].tenant)} into a batch of {_shown(let_in[0].batch)}), "
                f"mixed tenants, and refused all {len(same)} of the batch's own tenant: strcmp returns 0 when the "
                "texts are equal, so include a request when strcmp(batch tenant, its tenant) == 0")
    if let_in or mixed:
        seen = mixed or (f"IncludeRequest took {len(let_in)} requests into a batch of another tenant (e.g. "
                         f"{let_in[0].request_id}, {_shown(let_in[0].tenant)}, into a batch of "
                         f"{_shown(let_in[0].batch)}): mixed tenants")
        return (f"{seen}. IncludeRequest must refuse a request whose tenant is not the batch's first one (compare "
                "the whole text with strcmp; no tenant is tenant \"\")" + _mix_evidence(other, let_in))
    if kept_out:
        named = [o for o in same if o.tenant]
        shared = [o for o in same if not o.tenant and o.included]
        clause = ""
        if shared and named and not any(o.included for o in named):
            clause = (f"; only tenant-less requests shared a batch ({len(shared)} joined one): request_tenant gives "
                      "them all one \"\" literal, the same pointer, while each named request holds its own copy of "
                      "its tenant's text")
        return (f"IncludeRequest refused {len(kept_out)} of the {len(same)} requests offered to a batch of their own "
                f"tenant (e.g. {kept_out[0].request_id}, {_shown(kept_out[0].tenant)}, refused by a batch of "
                f"{_shown(kept_out[0].batch)}){clause}: requests of one tenant must share a batch. Compare tenant "
                "names with strcmp, not their pointers: two requests of one tenant never share a pointer")
    unseen = missing(offers)
    if unseen:
        return (f"the checker could not judge: in {LOGGED_TRIES} bursts it never saw {unseen[0]} (on a very busy "
                "machine requests reach the queue one by one): run the check again")
    return ""


def _mix_evidence(other: list[Offer], let_in: list[Offer]) -> str:
    """What the logged decisions show about a mixing comparison, or ``""`` when they single out no cause."""
    if not let_in:
        return ""
    if all(o.included for o in other) and any(not o.tenant.startswith(o.batch) for o in other):
        return (f"; it refused none of the {len(other)} requests of another tenant offered to a batch, so it did not "
                "compare tenants at all")
    prefix = all(o.tenant.startswith(o.batch) for o in let_in)
    refused_unlike = [o for o in other if not o.included and not o.tenant.startswith(o.batch)]
    if prefix and refused_unlike:
        o = let_in[0]
        return (f"; every tenant it let in begins with the batch's ({_shown(o.tenant)} into a batch of "
                f"{_shown(o.batch)}) and it refused those that do not ({len(refused_unlike)}): that is a comparison of "
                "only as many characters as the batch's tenant has (strncmp with its strlen)")
    return ""


def _shown(tenant: str) -> str:
    return "(no tenant)" if tenant == "" else repr(tenant)


def missing(offers: list[Offer]) -> list[str]:
    """What the logged offers do not show yet: a named tenant's request offered to a batch of its own, a request
    offered to a tenant-less batch, one whose tenant extends the batch's ('redwood' to 'red')."""
    wanted = {"a request offered to a batch of its own named tenant": lambda o: o.same and o.tenant,
              "a request offered to a batch of no tenant": lambda o: not o.same and not o.batch,
              "a request offered to a batch whose tenant begins its own": lambda o: (
                  not o.same and o.batch and o.tenant.startswith(o.batch))}
    return [name for name, test in wanted.items() if not any(test(o) for o in offers)]

"""The read model for operator surfaces: what a run looks like to the person deciding.

:class:`RunSummary` and :class:`StepSummary` are a run and a step as an
operator needs them; :func:`runs`, :func:`summary`, :func:`steps` and
:func:`detail` build them from full reads, :func:`runs_page` and
:func:`detail_page` from page reads. :func:`pending_approval` is the rule for
choosing the approval an operator means, the decision wrappers put the
runtime's errors in the operator's terms, and the bounding functions keep a
huge value showable. The ``agentrt`` command is a thin renderer over this.
"""

from agentrt.view.bounding import (
    MAX_FIELD_BYTES,
    approval_json,
    bound_approval,
    bound_raw,
    bound_string,
    bound_value,
)
from agentrt.view.chain import ChainCheck, KeptHead, check_chain
from agentrt.view.decisions import (
    MAX_LISTED_PENDING,
    approve,
    approve_shown,
    cancel,
    pending_approval,
    reject,
    reject_shown,
)
from agentrt.view.errors import (
    ECHO_CHARS,
    AmbiguousApprovalError,
    ApprovalDecidedError,
    ApprovalNotPendingError,
    DatabaseLockedError,
    ExpiredApprovalError,
    NoPendingApprovalError,
    RunFinishedError,
    RunNotWaitingError,
    ViewError,
    echo,
    echo_in,
)
from agentrt.view.summaries import (
    RunDetail,
    RunDetailPage,
    RunSummary,
    StepSummary,
    detail,
    detail_page,
    pending_approval_id,
    runs,
    runs_page,
    steps,
    steps_page,
    summary,
    summary_capped,
)

__all__ = [
    "ECHO_CHARS",
    "MAX_FIELD_BYTES",
    "MAX_LISTED_PENDING",
    "AmbiguousApprovalError",
    "ApprovalDecidedError",
    "ApprovalNotPendingError",
    "ChainCheck",
    "DatabaseLockedError",
    "ExpiredApprovalError",
    "KeptHead",
    "NoPendingApprovalError",
    "RunDetail",
    "RunDetailPage",
    "RunFinishedError",
    "RunNotWaitingError",
    "RunSummary",
    "StepSummary",
    "ViewError",
    "approval_json",
    "approve",
    "approve_shown",
    "bound_approval",
    "bound_raw",
    "bound_string",
    "bound_value",
    "cancel",
    "check_chain",
    "detail",
    "detail_page",
    "echo",
    "echo_in",
    "pending_approval",
    "pending_approval_id",
    "reject",
    "reject_shown",
    "runs",
    "runs_page",
    "steps",
    "steps_page",
    "summary",
    "summary_capped",
]

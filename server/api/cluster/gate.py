"""On a follower, inference and model management belong to the leader.

`leader_only(table, membership)` keeps a route table's paths, permissions and documentation
but answers every request (after the guard: a valid key is still needed) with 503
`service_unavailable_error` naming the leader's inference URL: API keys are per node, so the
client has to talk to the leader itself, and a redirect would only carry its key elsewhere.
"""
from __future__ import annotations

from dataclasses import replace

from ...http.errors import ApiError, ErrorKind

WHY = "this node is a follower: inference and model management are served by the cluster's leader"


def leader_only(table: dict, membership) -> dict:
    def refuse(ctx, request):
        raise ApiError(ErrorKind.UNAVAILABLE, refusal(membership))

    return {key: replace(endpoint, handler=refuse, responses={**endpoint.responses, 503: WHY})
            for key, endpoint in table.items()}


def refusal(membership) -> str:
    url = membership.leader_inference_url()
    if url is None:
        return (f"{WHY}, whose cluster URL is {membership.follower.leader_address} "
                "(its inference URL is not known yet: this node has not reached it)")
    return f"{WHY}: send this request to {url} with a key of that node"

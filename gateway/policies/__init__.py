"""The task policies (`policies/*.yaml`): their schema and loader, plain data.

Below the request's types (`gateway.request`), which carry the request's
policy; the policy stage (`gateway.policy`) applies it.
"""

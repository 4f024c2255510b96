"""Notices: what a notice says (:mod:`.render`), whom it reaches and on which channels
(:mod:`.recipients`), and how many a person may get (:mod:`.ratelimit`).

Sending is :mod:`gpu_cost.act.channels`' job; the ``advise`` / ``notify`` / ``notify_manager`` executor
that ties them together is :mod:`gpu_cost.act.notify`.
"""

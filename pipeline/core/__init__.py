"""The pure core: the call model, rendering, signing, the retry schedule, outcomes, the delivery and
routing policy, the config model, offsets, circuits, rate limits, audiences, time and durations.

Nothing here imports Kafka, HTTP or sockets (``tests/unit/test_layers.py`` enforces it): every
decision is a function of its arguments, tested without a broker.
"""

"""``LoopHistogram`` shows what ``prometheus_client.Histogram`` shows for the same observations
(its ``_created`` samples aside), and a scrape on another thread while it is observed never shows
buckets that disagree with the count."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from pipeline.runtime.loop_histogram import LoopHistogram

BUCKETS = (0.005, 0.01, 0.1, 1.0, 10.0)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            # The bounds themselves too: a value equal to a bound counts in that bound's bucket.
            st.one_of(st.sampled_from(BUCKETS), st.floats(0, 100, allow_nan=False)),
        ),
        max_size=60,
    )
)
def test_it_shows_the_samples_prometheus_client_shows(
    observations: list[tuple[str, float]],
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopHistogram("h_seconds", "H.", ["destination"], BUCKETS, ours)
    reference = Histogram("h_seconds", "H.", ["destination"], buckets=BUCKETS, registry=theirs)
    for label in ("a", "b", "c"):  # children made up front, as the pipeline's are on first use
        loop.labels(label)
        reference.labels(label)
    for label, amount in observations:
        loop.labels(label).observe(amount)
        reference.labels(label).observe(amount)
    mine, expected = _samples(ours), _samples(theirs)
    assert mine.keys() == expected.keys()
    for key, value in expected.items():
        assert mine[key] == pytest.approx(value), key


def test_without_labels_it_is_observed_directly() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopHistogram("e_seconds", "E.", (), BUCKETS, ours)
    reference = Histogram("e_seconds", "E.", buckets=BUCKETS, registry=theirs)
    for amount in (0.0, 0.01, 3.0, 50.0):
        loop.observe(amount)
        reference.observe(amount)
    assert _samples(ours) == _samples(theirs)


def test_wrong_label_values_are_refused_by_name() -> None:
    histogram = LoopHistogram("x_seconds", "X.", ["destination"], BUCKETS, CollectorRegistry())
    with pytest.raises(ValueError, match="x_seconds"):
        histogram.labels("a", "b")


def test_a_scrape_during_observations_shows_buckets_that_add_up_to_the_count() -> None:
    registry = CollectorRegistry()
    histogram = LoopHistogram("s_seconds", "S.", ["destination"], BUCKETS, registry)
    child = histogram.labels("a")
    done = threading.Event()

    def observe() -> None:
        for index in range(200_000):
            child.observe((index % 7) * 0.3)
        done.set()

    thread = threading.Thread(target=observe)
    thread.start()
    scrapes = 0
    while not done.is_set() or scrapes == 0:
        samples = _samples(registry)
        key = (("destination", "a"),)
        buckets = [
            value
            for (name, labels), value in samples.items()
            if name == "s_seconds_bucket" and ("destination", "a") in labels
        ]
        assert buckets == sorted(buckets)  # cumulative
        assert max(buckets) == samples[("s_seconds_count", key)]
        scrapes += 1
    thread.join()
    assert _samples(registry)[("s_seconds_count", (("destination", "a"),))] == 200_000

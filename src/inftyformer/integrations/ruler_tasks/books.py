"""The `!function`s of this folder's RULER tasks (lm_eval loads this file by its path):
`inftyformer.integrations.ruler_haystack`'s data, lm_eval's RULER scoring."""

from functools import partial

from lm_eval.tasks.ruler.common_utils import aggregate_metrics, process_results

from inftyformer.integrations.ruler_haystack import NEEDLES, books_samples

niah_single_2 = partial(books_samples, "niah_single_2")
niah_single_3 = partial(books_samples, "niah_single_3")
niah_multikey_1 = partial(books_samples, "niah_multikey_1")
niah_multivalue = partial(books_samples, "niah_multivalue")
niah_multiquery = partial(books_samples, "niah_multiquery")

__all__ = ["NEEDLES", "aggregate_metrics", "process_results", *NEEDLES]

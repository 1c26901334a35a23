"""timeseries.csv is written without pandas (sim.results.files.write.write_columns), byte for byte
as pandas' to_csv(index=False) would write the same columns."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from sim.results.files.write import write_columns


def test_columns_are_written_as_pandas_writes_them(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    columns = {
        "t_s": np.array([0.0, 0.1 + 0.2, 1e-7, 1e16, -0.0, 123456789.125]),
        "with_nan": np.array([math.nan, 1.5, math.nan, 2.0 / 3.0, 0.0, 7.0]),
        "all_nan": np.full(6, math.nan),
        "count": np.array([0, 1, -2, 2**40, 5, 6], dtype=np.int64),
        "small": np.array([1, 2, 3, 4, 5, 6], dtype=np.int32),
        "flag": np.array([True, False, True, True, False, False]),
        "noise": rng.lognormal(0.0, 3.0, 6),
    }
    write_columns(tmp_path / "ours.csv", columns)
    pd.DataFrame(columns).to_csv(tmp_path / "pandas.csv", index=False)
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_no_rows_is_a_header(tmp_path: Path) -> None:
    columns = {"a": np.zeros(0), "b": np.zeros(0, dtype=np.int64)}
    write_columns(tmp_path / "ours.csv", columns)
    pd.DataFrame(columns).to_csv(tmp_path / "pandas.csv", index=False)
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()

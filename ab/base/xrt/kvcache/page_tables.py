"""A numpy copy of every admitted sequence's page table, one row each, kept in step with the KV
cache manager: admission copies the table once, a decode step that opens a page writes one entry, and
freeing releases the row. A decode step then reads all its sequences' tables with one gather
instead of a Python loop over every page of every sequence."""

from __future__ import annotations

import numpy as np

from xrt.kvcache.interface import KVSeq


class PageTables:
    def __init__(self, rows: int = 64, width: int = 64) -> None:
        self.table = np.zeros((rows, width), dtype=np.int32)
        self._free_rows = list(range(rows - 1, -1, -1))

    @property
    def num_rows_in_use(self) -> int:
        return self.table.shape[0] - len(self._free_rows)

    def assign(self, seq: KVSeq) -> None:
        """Give seq a row holding its current page table."""
        if seq.table_row < 0:
            if not self._free_rows:
                self._grow(rows=2 * self.table.shape[0])
            seq.table_row = self._free_rows.pop()
        self._fit(len(seq.page_table))
        self.table[seq.table_row, : len(seq.page_table)] = seq.page_table

    def appended(self, seq: KVSeq) -> None:
        """seq.page_table gained its last page."""
        k = len(seq.page_table) - 1
        self._fit(k + 1)
        self.table[seq.table_row, k] = seq.page_table[k]

    def release(self, seq: KVSeq) -> None:
        if seq.table_row >= 0:
            self._free_rows.append(seq.table_row)
            seq.table_row = -1

    def _fit(self, width: int) -> None:
        if width > self.table.shape[1]:
            self._grow(width=max(width, 2 * self.table.shape[1]))

    def _grow(self, rows: int | None = None, width: int | None = None) -> None:
        old_rows, old_width = self.table.shape
        rows, width = rows or old_rows, width or old_width
        table = np.zeros((rows, width), dtype=np.int32)
        table[:old_rows, :old_width] = self.table
        self.table = table
        self._free_rows[:0] = range(rows - 1, old_rows - 1, -1)

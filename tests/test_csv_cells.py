"""audit.reporting.csv_cells: text a spreadsheet would run as a formula is escaped (OWASP), numbers are not."""

import csv
import io

import numpy as np
import pytest

from audit.reporting.csv_cells import spreadsheet_safe, spreadsheet_safe_row


@pytest.mark.parametrize("text", ["=1+1", "+1", "-1", "-0.5", "@SUM(A1)", "\tx", "\rx",
                                  "=HYPERLINK(\"http://evil\", \"click\")"])
def test_text_a_spreadsheet_would_evaluate_gets_a_leading_quote(text):
    assert spreadsheet_safe(text) == "'" + text


@pytest.mark.parametrize("value", ["collaborator1", "a=b", "", "'=already", " =x", "0.5", "mia_local_loss_auc"])
def test_other_text_is_unchanged(value):
    assert spreadsheet_safe(value) == value


@pytest.mark.parametrize("value", [-0.5, -3, np.float64(-1e-300), np.int64(-7), float("-inf"), None, True])
def test_numbers_and_other_values_are_unchanged(value):
    assert spreadsheet_safe(value) is value


def test_a_row_written_by_the_csv_module_reads_back_with_the_quote_and_the_number():
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(spreadsheet_safe_row(["=cmd|' /C calc'!A0", -0.5, "ok"]))
    assert buf.getvalue() == "'=cmd|' /C calc'!A0,-0.5,ok\n"
    assert next(csv.reader(io.StringIO(buf.getvalue()))) == ["'=cmd|' /C calc'!A0", "-0.5", "ok"]

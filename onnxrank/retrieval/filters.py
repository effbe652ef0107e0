"""Metadata filters compiled to a SQL condition over the chunk table (used by both index sides).

A filter maps a metadata field to a condition:

* ``{"lang": "en"}``: equality;
* ``{"lang": ["en", "de"]}``: membership;
* ``{"year": {"gte": 1990, "lt": 2000}}`` or ``{"date": {"gte": "2024-01-01"}}``: range with
  ``gt``, ``gte``, ``lt``, ``lte`` (numbers compare numerically, ISO dates as strings).

All conditions must hold. Values are bound as SQL parameters; field names become quoted JSON paths.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

Filters = Mapping[str, Any]
RANGE_OPERATORS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
SCALAR_TYPES = (str, int, float, bool)


def compile_filters(filters: Filters | None, *, column: str = "c.metadata") -> tuple[str, list[Any]]:
    """Turn a filter mapping into ``(sql_condition, parameters)``; ``("1", [])`` when empty.

    Args:
        filters: Field to condition, see the module docstring.
        column: SQL expression holding the metadata JSON.

    Returns:
        A condition to AND into a WHERE clause and its positional parameters.

    Raises:
        ValueError: A field name contains a double quote, a value is not a scalar, a list is empty,
            or a range uses an unknown operator.
    """
    if not filters:
        return "1", []
    clauses: list[str] = []
    parameters: list[Any] = []
    for field_name, condition in filters.items():
        if not isinstance(field_name, str) or not field_name or '"' in field_name:
            raise ValueError(
                f"filter field names must be non-empty strings without double quotes, got {field_name!r}"
            )
        path = f'$."{field_name}"'
        value_sql = f"json_extract({column}, ?)"
        if isinstance(condition, Mapping):
            unknown = set(condition) - set(RANGE_OPERATORS)
            if not condition or unknown:
                raise ValueError(
                    f"range filter on {field_name!r} has operators {sorted(map(str, condition))}; "
                    f"allowed: {', '.join(RANGE_OPERATORS)}"
                )
            for operator, bound in condition.items():
                _check_scalar(field_name, bound)
                clauses.append(f"{value_sql} {RANGE_OPERATORS[operator]} ?")
                parameters.extend([path, bound])
        elif isinstance(condition, (list, tuple, set, frozenset)):
            values = list(condition)
            if not values:
                raise ValueError(
                    f"membership filter on {field_name!r} is an empty list; it would match nothing"
                )
            for value in values:
                _check_scalar(field_name, value)
            clauses.append(f"{value_sql} IN ({', '.join('?' * len(values))})")
            parameters.extend([path, *values])
        else:
            _check_scalar(field_name, condition)
            clauses.append(f"{value_sql} = ?")
            parameters.extend([path, condition])
    return " AND ".join(clauses), parameters


def _check_scalar(field_name: str, value: Any) -> None:
    if not isinstance(value, SCALAR_TYPES):
        raise ValueError(
            f"filter value for {field_name!r} must be a string, number or bool, "
            f"got {json.dumps(value, default=repr)}"
        )

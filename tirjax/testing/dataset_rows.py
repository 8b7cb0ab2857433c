"""Dataset rows in each source's own format, to load without the real datasets: one ToolHop row
(tools that clash, print, fail to load) and FTRL parquet tables."""

import json

import pyarrow as pa
import pyarrow.parquet as pq


def object_schema(**props):
  """A JSON schema of an object whose properties (`name=type`) are all required."""
  return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()},
          "required": sorted(props)}


TOOLHOP_ROW = {
    "id": "toolhop-fixture", "question": "How long is the last name of X's father?",
    "answer": "5", "hop_count": 3, "domain": "Genealogy", "answer_type": "number",
    "sub_task": {"Who is the father of X?": "John Smith"},
    "tools": {
        "a": {"name": "father_of", "description": "father",
              "parameters": object_schema(person="string")},
        "b": {"name": "extract_part", "description": "a part of a name",
              "parameters": object_schema(full_name="string", part="string")},
        "c": {"name": "extract_part", "description": "upper case",
              "parameters": object_schema(text="string")},
        "d": {"name": "length", "description": "length", "parameters": object_schema(s="string")},
        "e": {"name": "broken", "description": "", "parameters": object_schema(x="string")},
    },
    "functions": [
        "def length(s):\n    return len(s)\n\nprint('example:', length('abc'))",
        "def father_of(person):\n    if person == 'X':\n        return {'father': 'John Smith'}\n"
        "    return {'error': 'unknown person'}",
        "def extract_part(text):\n    return text.upper()",
        "def extract_part(full_name, part='last'):\n    first, last = full_name.split()\n"
        "    return last if part == 'last' else first",
        "def broken(x):\n    return x\nraise RuntimeError('broken at definition')",
    ],
    "gold_calls": ["father_of(person='X')", "extract_part('John Smith', part='last')",
                   "length('Smith')", "extract_part(text='smith')"],
}


def write_ftrl_table(path, num_rows=2):
  """Writes an FTRL parquet table of `num_rows` questions on two tools (one imports dateutil)."""
  code = ("def stock_price(ticker, date):\n    import dateutil.parser\n"
          "    day = dateutil.parser.parse(date).strftime('%Y-%m-%d')\n"
          "    return {'ticker': ticker, 'date': day, 'price': 123.4 if ticker == 'ACME' else 1}\n")
  tools = [{"type": "function",
            "function": {"name": "stock_price", "description": "price",
                         "parameters": object_schema(ticker="string", date="string")}},
           {"type": "function",
            "function": {"name": "noop", "description": "nothing",
                         "parameters": {"type": "object", "properties": {}}}}]
  rows = [{"messages": [{"role": "user", "content": f"Question {i}: price of ACME?"}],
           "tools": json.dumps(tools),
           "codes": json.dumps({"stock_price": code, "noop": "def noop():\n    return 'ok'"}),
           "unsolved_set": json.dumps({"stock_price": ["123.4", "2024-01-02"]}),
           "solve_rate": 0.0, "data_source": "self/single_hop", "split": "test",
           "answer": "123.4"} for i in range(num_rows)]
  pq.write_table(pa.Table.from_pylist(rows), path)

"""Tool environments (spec §6).

`tools` (the shared data model: Tool, Task, ToolSession), `parser` (a step and the formatting
checks 1-4), `executor` (`ToolEnv`: one episode; check 5, answers, T_max, FTRL solves),
`sandbox` (a worker process for dataset tool code), `judge` (rule-based and LLM judges),
`metrics`, `call_arrays` (episode calls → `Rollouts` call arrays), `datasets` (ToolHop, FTRL,
BFCL multi-turn).
"""

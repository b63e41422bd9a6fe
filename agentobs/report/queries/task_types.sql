-- query: task_types
-- summary: Per task type: tasks and the p50/p90/p99/max of a task's cost, a task's type being the type of most of
--   its calls (a tie: the least, the same every run).
-- reads: m_calls
-- params:
-- template:
-- notes: from the (task, type) pairs, not mode() over every call per task (cheaper; docs/metrics.md).
SELECT task_type, count(*) AS tasks, quantile_cont(cost_usd, 0.5) AS cost_p50_usd,
       quantile_cont(cost_usd, 0.9) AS cost_p90_usd, quantile_cont(cost_usd, 0.99) AS cost_p99_usd,
       max(cost_usd) AS cost_max_usd
FROM (SELECT task_id, sum(cost_usd) AS cost_usd, arg_min(task_type, (-n, task_type)) AS task_type
      FROM (SELECT task_id, task_type, sum(cost_usd) AS cost_usd, count(*) AS n
            FROM m_calls WHERE in_win GROUP BY task_id, task_type)
      GROUP BY task_id)
GROUP BY task_type

-- query: about
-- summary: What each session or task of the top lists is: its usual task type, tenant, agent and model
--   (agentobs.metrics.usual), first start, last end and first session.
-- reads: m_calls
-- params: ids
-- template: key (session_id or task_id), usual (the usual-value CTEs, agentobs.metrics.usual.usual_cte)
-- notes: one scan of the ids' calls grouped by the attribute combination; the rest comes from those few groups.
--   The first session is the earliest call's (a tie: the least id).
WITH g AS MATERIALIZED (
    SELECT {key} AS id, task_type, tenant, agent_name, model, count(*) AS n, min(start_s) AS first_start_s,
           max(end_s) AS last_end_s, arg_min(session_id, (start_s, session_id)) AS first_session_id
    FROM m_calls
    WHERE in_win AND list_contains($ids, {key})
    GROUP BY ALL
),
{usual}
SELECT b.id, u_task_type.task_type, u_tenant.tenant, u_agent_name.agent_name, u_model.model, b.first_start_s,
       b.last_end_s, b.first_session_id
FROM (SELECT id, min(first_start_s) AS first_start_s, max(last_end_s) AS last_end_s,
             arg_min(first_session_id, (first_start_s, first_session_id)) AS first_session_id
      FROM g GROUP BY id) b
LEFT JOIN u_task_type ON u_task_type.id = b.id LEFT JOIN u_tenant ON u_tenant.id = b.id
LEFT JOIN u_agent_name ON u_agent_name.id = b.id LEFT JOIN u_model ON u_model.id = b.id

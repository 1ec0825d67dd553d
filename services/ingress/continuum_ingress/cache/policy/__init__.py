"""Pure decisions of the response cache (eligibility, tenant, semantic partitioning)."""

"""`glm53 router`: vLLM's own router (vllm-router) configured, checked and launched in front of glm53 servers."""

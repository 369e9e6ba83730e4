"""Conversions between API dialects (OpenAI Responses and Chat Completions)."""

"""Advice and judgement: the seed's claims judged, `tune`, `tune --users`, the doctor."""

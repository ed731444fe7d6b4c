"""Seeded synthetic request logs: sessions with growing prompts, bursty diurnal arrivals,
heavy-tailed lengths, provider-style reported cache hits, written in any ingest format."""

from pipeline.synth.generate import SynthConfig, generate
from pipeline.synth.writers import SYNTH_FORMATS, write_logs

__all__ = ["SYNTH_FORMATS", "SynthConfig", "generate", "write_logs"]

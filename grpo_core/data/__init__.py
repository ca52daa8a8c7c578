"""Prompt, SFT and preference rows: reading and normalising sources (``rows``), the prepare_data stage as a
function (``prepare``: dedupe, decontaminate, split), the built-in tasks (``synthetic``: chain arithmetic;
``general``: helpful/unsafe prompts), cold-start sets (``cold_start``: files, reasoning traces, teacher
sampling), R1's readability filters (``readability``) and the consolidation mix (``consolidation``).
"""

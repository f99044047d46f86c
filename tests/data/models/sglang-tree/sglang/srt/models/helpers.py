# No EntryClass: registers nothing.
class HelperForCausalLM:
    pass

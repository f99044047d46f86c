from sglang.srt.models.base import BaseForCausalLM


class BaseForCausalLMEagle3(BaseForCausalLM):
    pass


EntryClass = [BaseForCausalLMEagle3]

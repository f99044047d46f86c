# Inherits the hooks through an import: by a renamed name, and as a module attribute.
from sglang.srt.models import base
from sglang.srt.models.base import BaseForCausalLM as Parent


class ChildForCausalLM(Parent):
    pass


class CousinForCausalLM(base.BaseForCausalLM):
    pass


EntryClass = [ChildForCausalLM, CousinForCausalLM]

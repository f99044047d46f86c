# A stand-in model file: a target with both capture hooks.
class BaseForCausalLM:
    def set_dflash_layers_to_capture(self, layer_ids):
        pass

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        pass


class PlainForCausalLM:
    pass


EntryClass = [BaseForCausalLM, PlainForCausalLM]

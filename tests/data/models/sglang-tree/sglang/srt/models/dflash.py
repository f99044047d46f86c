class DFlashDraftModel:
    pass


EntryClass = DFlashDraftModel

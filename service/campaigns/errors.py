from service.errors import Conflict, NotFound


class CampaignNotFound(NotFound):
    code = "campaign_not_found"


class RealizationNotFound(NotFound):
    code = "realization_not_found"


class IdempotencyKeyReused(Conflict):
    code = "idempotency_key_reused"


class CampaignNotFinished(Conflict):
    code = "campaign_not_finished"


class CampaignAlreadyFinished(Conflict):
    code = "campaign_finished"
